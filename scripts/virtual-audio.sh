#!/usr/bin/env bash
# A private PulseAudio with a virtual microphone and speaker, for tests and demos without hardware.
#   scripts/virtual-audio.sh start   # prints the environment to export (eval "$(... start)")
#   scripts/virtual-audio.sh stop
# VIRTUAL_AUDIO_RUNTIME picks its runtime folder (default /tmp/assistant-pulse-UID), so runs can be kept apart.
# Devices: play a WAV into sink "micfeed" and the app hears it on source "virtmic";
# what the app plays on sink "spk" can be recorded from "spk.monitor".
set -euo pipefail
runtime=${VIRTUAL_AUDIO_RUNTIME:-/tmp/assistant-pulse-$(id -u)}
export XDG_RUNTIME_DIR=$runtime PULSE_RUNTIME_PATH=$runtime/pulse
export PULSE_SERVER=unix:$runtime/pulse/native

case "${1:-}" in
start)
  command -v pulseaudio >/dev/null || {
    echo "pulseaudio missing: run scripts/setup.sh --dev (or apt-get install pulseaudio pulseaudio-utils libasound2-plugins)" >&2
    exit 1
  }
  mkdir -p "$runtime/pulse" && chmod 700 "$runtime"
  if ! pactl info >/dev/null 2>&1; then
    # A server killed moments ago can linger as a zombie until init reaps it; pulseaudio then
    # takes its pid file for a running daemon and refuses to start. Such a pid file is stale.
    pidfile=$runtime/pulse/pid
    if [ -f "$pidfile" ]; then
      state=$(ps -o stat= -p "$(cat "$pidfile")" 2>/dev/null || true)
      case "$state" in "" | Z*) rm -f "$pidfile" ;; esac
    fi
    pulseaudio --daemonize=yes --exit-idle-time=-1 --disallow-exit --system=false \
      --log-target=file:"$runtime/pulse.log" -n \
      --load="module-native-protocol-unix socket=$runtime/pulse/native auth-anonymous=1" \
      --load="module-null-sink sink_name=micfeed rate=16000 channels=1" \
      --load="module-remap-source source_name=virtmic master=micfeed.monitor" \
      --load="module-null-sink sink_name=spk rate=16000 channels=1" 2>/dev/null
    for _ in $(seq 50); do pactl info >/dev/null 2>&1 && break; sleep 0.1; done
    pactl info >/dev/null 2>&1 || {
      echo "pulseaudio did not start; see $runtime/pulse.log" >&2
      exit 1
    }
  fi
  # Every (re)start: a server started again must offer the same defaults, or the app's
  # "default" device would open a dummy sink or source after a restart.
  pactl set-default-source virtmic && pactl set-default-sink spk
  # PortAudio (sounddevice) sees PulseAudio through ALSA's pulse plugin.
  asoundrc=$runtime/asoundrc
  printf 'pcm.!default { type pulse }\nctl.!default { type pulse }\npcm.pulse { type pulse }\nctl.pulse { type pulse }\n' > "$asoundrc"
  echo "export XDG_RUNTIME_DIR=$runtime PULSE_RUNTIME_PATH=$runtime/pulse PULSE_SERVER=$PULSE_SERVER ALSA_CONFIG_PATH=/usr/share/alsa/alsa.conf:$asoundrc"
  ;;
stop)
  pactl exit >/dev/null 2>&1 || pulseaudio --kill >/dev/null 2>&1 || true
  ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac

#!/usr/bin/env bash
# A private PulseAudio with a virtual microphone and speaker, for tests and demos without hardware.
#   scripts/virtual-audio.sh start   # prints the environment to export (eval "$(... start)")
#   scripts/virtual-audio.sh stop
#   scripts/virtual-audio.sh echo on [DELAY_MS [GAIN_DB [REFLECTIONS]]]   # defaults 60 -13 2
#   scripts/virtual-audio.sh echo off
#   scripts/virtual-audio.sh echo mute|unmute   # silence the echo path, or let it through again
# VIRTUAL_AUDIO_RUNTIME picks its runtime folder (default /tmp/assistant-pulse-UID), so runs can be kept apart.
# Devices: play a WAV into sink "micfeed" and the app hears it on source "virtmic";
# what the app plays on sink "spk" can be recorded from "spk.monitor".
# "echo on" adds a speaker-to-microphone echo path: spk.monitor -> micfeed through module-loopback
# (latency_msec = DELAY_MS, 20-150) at GAIN_DB (-6 to -20; the loopback's sink-input volume, in dB,
# because PulseAudio's percent scale is cubic), plus REFLECTIONS (0-3) weaker, later copies as a
# small room tail: reflection k comes 23*k ms after the direct path, 6*k dB below it.
# "echo mute" then "echo unmute" makes an echo appear mid-session with a steady delay, as when a
# headset is unplugged: a loopback loaded while the app plays slews its latency for seconds.
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
echo)
  # Every loopback this script loads carries this tag in its arguments, so "off" unloads only them.
  tag=assistant-echo
  ours() { pactl list short modules | awk -v t="$tag" '$2 == "module-loopback" && index($0, t) {print $1}'; }
  if [[ "${2:-}" == mute || "${2:-}" == unmute ]]; then
    for id in $(ours); do
      input=$(pactl list sink-inputs | awk -v m="$id" '/^Sink Input #/ {i = substr($3, 2)} $1 == "Owner" && $3 == m {print i}')
      pactl set-sink-input-mute "$input" "$([[ "$2" == mute ]] && echo 1 || echo 0)"
    done
    exit 0
  fi
  for id in $(ours); do
    pactl unload-module "$id"
  done
  case "${2:-}" in
  off) ;;
  on)
    delay_ms=${3:-60} gain_db=${4:--13} reflections=${5:-2}
    in_range() { awk -v v="$1" -v lo="$2" -v hi="$3" 'BEGIN { exit !(v >= lo && v <= hi) }'; }
    in_range "$delay_ms" 20 150 || { echo "echo delay $delay_ms ms is outside 20-150" >&2; exit 2; }
    in_range "$gain_db" -20 -6 || { echo "echo gain $gain_db dB is outside -20..-6" >&2; exit 2; }
    in_range "$reflections" 0 3 || { echo "echo reflections $reflections is outside 0-3" >&2; exit 2; }
    for k in $(seq 0 "$reflections"); do
      tap_ms=$((delay_ms + 23 * k))
      tap_db=$(awk -v g="$gain_db" -v k="$k" 'BEGIN { print g - 6 * k }')
      # stream_name=... carries the tag (module arguments are listed by "pactl list short modules").
      module=$(pactl load-module module-loopback source=spk.monitor sink=micfeed \
        latency_msec="$tap_ms" source_dont_move=true sink_dont_move=true \
        sink_input_properties=media.name=$tag-$k)
      input=$(pactl list sink-inputs | awk -v m="$module" \
        '/^Sink Input #/ {id = substr($3, 2)} $1 == "Owner" && $3 == m {print id}')
      pactl set-sink-input-volume "$input" "${tap_db}dB"
    done
    ;;
  *)
    echo "usage: $0 echo on [DELAY_MS [GAIN_DB [REFLECTIONS]]] | echo off | echo mute | echo unmute" >&2
    exit 2
    ;;
  esac
  ;;
stop)
  pactl exit >/dev/null 2>&1 || pulseaudio --kill >/dev/null 2>&1 || true
  ;;
*)
  echo "usage: $0 start|stop|echo on|off" >&2
  exit 2
  ;;
esac

#!/usr/bin/env bash
# Set up everything the assistant needs on this machine: system packages, .venv, models.
#   scripts/setup.sh          runtime only
#   scripts/setup.sh --dev    plus test tools and the packages the tests use (Piper included)
#   scripts/setup.sh --piper  plus the natural voice (--tts piper): piper-tts (GPL-3.0-or-later,
#                             so opt-in) and the voice en_US-joe-medium; or ASSISTANT_PIPER=1
#   scripts/setup.sh --serve  plus Triton Inference Server for 'assistant serve' (nvidia-pytriton,
#                             which pins numpy below 2) and its client
# Re-running is cheap: each step is skipped when already done.
# With an NVIDIA GPU it also installs the TensorRT that fits the GPU and driver (chosen by
# setup_gpu.py from nvidia-smi); if that install fails, setup says so in one line
# and carries on (the decoder then runs on PyTorch with CUDA graphs).
#   ASSISTANT_TENSORRT=none|tensorrt-rtx|tensorrt-cu13|tensorrt-cu12   overrides the choice
set -euo pipefail
cd "$(dirname "$0")/.."
dev=0
piper=0
serve=0
[[ "${ASSISTANT_PIPER:-0}" == 1 ]] && piper=1
for arg in "$@"; do
  case "$arg" in
    --dev) dev=1; piper=1 ;;
    --piper) piper=1 ;;
    --serve) serve=1 ;;
    *) echo "usage: scripts/setup.sh [--dev] [--piper] [--serve]" >&2; exit 2 ;;
  esac
done

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# System packages: PortAudio for sounddevice, espeak-ng for pyttsx3; the tests also use a
# private PulseAudio as virtual microphone/speaker, espeak-ng/sox for utterances, tmux for the UI,
# and Prometheus with promtool for docs/monitoring/ (tests/integration/test_prometheus_dashboards.py).
apt_pkgs=(libportaudio2 libespeak-ng1 espeak-ng alsa-utils)
(( dev )) && apt_pkgs+=(pulseaudio pulseaudio-utils libasound2-plugins sox tmux prometheus)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if (( ${#missing[@]} )); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    say "installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    say "missing system packages; install them with:"
    say "  sudo apt-get install ${missing[*]}"
    say "(continuing: text chat works without them)"
  fi
fi

python=${PYTHON:-python3}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "Python >= 3.11 is required (found $("$python" --version)); set PYTHON=/path/to/python3.11" >&2
  exit 1
}
[[ -x .venv/bin/python ]] || { say "creating .venv"; "$python" -m venv .venv; }

gpu=0
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 && gpu=1
extras=""
tensorrt=""
if (( gpu )); then
  # Which cuda-python major (extra gpu or gpu-cu13) and TensorRT flavour fit the GPUs and driver.
  gpus=$(nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || true)
  choice=$(printf '%s\n' "$gpus" | .venv/bin/python -m setup_gpu "${ASSISTANT_TENSORRT:-auto}")
  read -r extras tensorrt why <<<"$choice"
fi
(( dev )) && extras="${extras:+$extras,}dev"
(( piper )) && extras="${extras:+$extras,}piper"
(( serve )) && extras="${extras:+$extras,}serve"
stamp=.venv/.setup-stamp
want="$(sha256sum pyproject.toml | cut -c1-16) extras=[$extras] gpu=$gpu${tensorrt:+ tensorrt=$tensorrt}"
have=$(cat "$stamp" 2>/dev/null || true)
# Done when the stamp is what is wanted, or the same with more extras: run.sh (no extras) after
# test.sh (--dev) must not install again at every switch (~9 s of pip each time).
covers() {
  local had=${have% (tensorrt install failed)} extra
  [[ "${had/extras=\[*\]/}" == "${want/extras=\[*\]/}" ]] || return 1
  local installed=${had#*extras=[} wanted=${want#*extras=[}
  installed=,${installed%%]*}, wanted=${wanted%%]*}
  for extra in ${wanted//,/ }; do
    [[ "$installed" == *",$extra,"* ]] || return 1
  done
}
# A failed TensorRT install is recorded, not retried at every start (run.sh runs setup each time).
if ! covers; then
  [[ -n "$tensorrt" ]] && say "GPU: $why"
  .venv/bin/python -m pip install -q --upgrade pip
  # --no-compile: Python compiles what it imports when it first imports it, not all of torch
  # and its neighbours up front (set-up 23 s shorter on 2 cores; the first import no slower),
  # and keeps it: run.sh and test.sh unset PYTHONDONTWRITEBYTECODE.
  pip=(.venv/bin/python -m pip install -q --no-compile)
  if (( ! gpu )); then
    # No CUDA GPU: pin the CPU build of torch; an unpinned torch pulls a multi-GB CUDA build.
    say "no NVIDIA GPU found: installing CPU torch"
    "${pip[@]}" ${ASSISTANT_TORCH_INDEX:+--index-url "$ASSISTANT_TORCH_INDEX"} "torch==2.13.0"
  fi
  say "installing the assistant${extras:+ with extras [$extras]}"
  "${pip[@]}" -e ".${extras:+[$extras]}"
  outcome=""
  if [[ -n "$tensorrt" && "$tensorrt" != none ]]; then
    # Its own step: the assistant is installed already, so a failure here costs only TensorRT.
    say "installing $tensorrt"
    log=.venv/tensorrt-install.log
    if ! "${pip[@]}" -e ".[$extras,$tensorrt]" >"$log" 2>&1; then
      error=$(grep '^ERROR:' "$log" | tail -n 1 | cut -c8-160 || true)
      say "TensorRT not installed: pip install -e '.[$extras,$tensorrt]' failed (${error:-see $log}; log: $log): the decoder runs on PyTorch with CUDA graphs; retry: rm $stamp && scripts/setup.sh"
      outcome=" (tensorrt install failed)"
    fi
  fi
  echo "$want$outcome" > "$stamp"
fi

.venv/bin/assistant models fetch
if (( piper )); then
  voice=en_US-joe-medium
  # Fetched when missing, and again when damaged (the notice of a damaged voice names this script).
  .venv/bin/assistant models fetch --check "$voice" >/dev/null 2>&1 || .venv/bin/assistant models fetch --force "$voice"
fi

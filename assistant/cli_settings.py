"""The settings flags (``dest="section.key"``) and which commands read each, for ``assistant.cli``.

A subcommand's parser gets only the flags of the settings it reads, so its ``--help`` lists
what applies to it; the bare ``assistant`` (the UI) and ``run`` get them all.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

# Which commands read each flag's setting: a subcommand's --help lists only those.
# "assistant" is the bare command (the UI, or text chat without a terminal).
ALL = frozenset({"assistant", "run", "chat", "serve", "devices", "models", "engine"})
LLM = frozenset({"assistant", "run", "chat", "serve", "engine"})  # the decoder, wherever it runs
LOCAL_LLM = LLM - {"serve"}  # serve always runs its decoder under Triton
CLIENT = frozenset({"assistant", "run", "chat"})  # turns answered here: sampling, the LLM server
PROMPT = CLIENT | {"engine"}  # the system prompt (engine verify's gate prompts use it)
VOICE = frozenset({"assistant", "run"})  # microphone, ASR, turns, speech, barge-in, metrics
TTS_FETCH = VOICE | {"models"}  # models fetch fetches the configured Piper voice


def settings_flags(parser: argparse.ArgumentParser, command: str = "assistant") -> None:
    """Add the settings flags that ``command`` (a key of the ``USES`` sets) reads, and ``-v``."""
    from assistant.stages.llm import BACKENDS

    # SUPPRESS: an unset flag leaves no attribute, so `assistant --model X chat` keeps X.
    parser.argument_default = argparse.SUPPRESS
    g = parser.add_argument_group("settings (override the config file and ASSISTANT_* variables)")

    def add(used_by: frozenset[str], *names: str, **options: Any) -> None:
        if command in used_by:
            g.add_argument(*names, **options)

    add(
        ALL,
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings file (default ~/.config/assistant/config.toml)",
    )
    add(
        ALL,
        "--store",
        dest="models.store_dir",
        metavar="DIR",
        help="model store (default ~/.cache/assistant)",
    )
    add(
        LLM,
        "--model",
        dest="models.llm",
        metavar="NAME|DIR|FILE.gguf|hf:ORG/NAME[@REV]",
        help="LLM: store name, local Hugging Face folder, a GGUF file or a folder holding one "
        "(converted once into the store), or hf:org/name[@revision] (downloaded once into the "
        "store, online, pinned to a commit)",
    )
    add(
        LOCAL_LLM,
        "--backend",
        dest="decoder.backend",
        choices=BACKENDS,
        help="decoder backend (default auto: TensorRT on a GPU it supports, its engine built once and "
        "checked by the accuracy gate, else the next backend, saying why)",
    )
    add(
        CLIENT,
        "--llm-server",
        dest="decoder.server",
        metavar="HOST:PORT",
        help="decode on 'assistant serve' there (Triton, gRPC; grpc://HOST:PORT as its banner prints "
        "it works too, and the port is 8001 when left out); mic, ASR and TTS stay here",
    )
    add(LLM, "--device", dest="decoder.device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N")
    add(LLM, "--dtype", dest="decoder.dtype", choices=["auto", "fp32", "fp16", "bf16"])
    add(
        LLM,
        "--cuda-graph",
        dest="decoder.cuda_graph",
        choices=["auto", "on", "off"],
        help="replay CUDA graphs",
    )
    add(
        LOCAL_LLM,
        "--compile",
        dest="decoder.compile",
        action="store_const",
        const=True,
        help="torch.compile the graphs",
    )
    add(
        LLM,
        "--context-tokens",
        dest="decoder.context_tokens",
        type=int,
        metavar="N",
        help="KV cache size in tokens",
    )
    add(LLM, "--threads", dest="decoder.threads", type=int, metavar="N", help="CPU threads (0 = auto)")
    add(CLIENT, "--max-new-tokens", dest="generation.max_new_tokens", type=int, metavar="N")
    add(CLIENT, "--temperature", dest="generation.temperature", type=float, metavar="T", help="0 = greedy")
    add(CLIENT, "--top-k", dest="generation.top_k", type=int, metavar="K")
    add(CLIENT, "--top-p", dest="generation.top_p", type=float, metavar="P")
    add(CLIENT, "--repetition-penalty", dest="generation.repetition_penalty", type=float, metavar="X")
    add(CLIENT, "--seed", dest="generation.seed", type=int, metavar="N")
    add(PROMPT, "--system-prompt", dest="dialogue.system_prompt", metavar="TEXT")
    add(VOICE, "--mic", dest="audio.input_device", metavar="DEVICE", help="input device: index or name part")
    add(
        VOICE,
        "--speaker",
        dest="audio.output_device",
        metavar="DEVICE",
        help="output device: index or name part",
    )
    add(
        VOICE,
        "--asr-model",
        dest="asr.model",
        metavar="NAME|DIR",
        help="Whisper model (default whisper-tiny.en): store name, CTranslate2 folder; the torch backend "
        "also takes a Hugging Face folder or hf:org/name",
    )
    add(VOICE, "--asr-device", dest="asr.device", metavar="DEVICE", help="auto, cpu, cuda")
    add(
        VOICE,
        "--asr-backend",
        dest="asr.backend",
        choices=["auto", "ctranslate2", "torch"],
        help="ASR runtime: ctranslate2 (faster-whisper), torch (transformers: GPUs CTranslate2 cannot use), "
        "auto (default: torch on CUDA when CTranslate2 has no CUDA)",
    )
    add(
        VOICE,
        "--asr-window",
        dest="asr.window",
        choices=["fit", "full"],
        help="Whisper's input: fit (default: max(--asr-floor-s, speech + 0.5 s), falling back to the "
        "30 s window when the decode looks wrong; CTranslate2 backend) or full (always 30 s)",
    )
    add(
        VOICE,
        "--asr-floor-s",
        dest="asr.floor_s",
        type=float,
        metavar="S",
        help="shortest window of --asr-window fit, seconds (default 10; 1 to 30)",
    )
    add(
        TTS_FETCH,
        "--tts",
        dest="tts.engine",
        choices=["pyttsx3", "piper"],
        help="text to speech: pyttsx3 (espeak-ng, default) or piper (natural voice, opt-in: scripts/setup.sh "
        "--piper; falls back to pyttsx3, saying why)",
    )
    add(
        TTS_FETCH,
        "--piper-voice",
        dest="tts.piper_voice",
        metavar="NAME|FILE.onnx",
        help="Piper voice (default en_US-joe-medium)",
    )
    add(
        VOICE,
        "--tts-threads",
        dest="tts.threads",
        type=int,
        metavar="N",
        help="Piper's CPU threads (default 1; 0: one per core)",
    )
    add(
        VOICE,
        "--voice",
        dest="tts.voice",
        metavar="VOICE",
        help="pyttsx3 voice (id or name part, e.g. en-us)",
    )
    add(
        VOICE,
        "--tts-rate",
        dest="tts.rate_wpm",
        type=int,
        metavar="WPM",
        help="speaking rate, words per minute",
    )
    add(
        VOICE,
        "--end-silence-ms",
        dest="vad.end_silence_ms",
        type=int,
        metavar="MS",
        help="silence that ends a turn with --turn-detection off",
    )
    add(
        VOICE,
        "--turn-detection",
        dest="turn.detection",
        choices=["smart-turn", "off"],
        help="end of turn: the Smart Turn model (default), or off: fixed --end-silence-ms",
    )
    add(
        VOICE,
        "--pause-ms",
        dest="turn.pause_ms",
        type=int,
        metavar="MS",
        help="silence before the model scores",
    )
    add(
        VOICE,
        "--max-silence-ms",
        dest="turn.max_silence_ms",
        type=int,
        metavar="MS",
        help="silence that ends a turn whatever the model says",
    )
    add(
        VOICE,
        "--question-ms",
        dest="turn.question_ms",
        type=int,
        metavar="MS",
        help="silence that ends a turn heard as a question of 5+ words, whatever the model says (0: off)",
    )
    add(
        VOICE,
        "--no-speculation",
        dest="turn.speculate",
        action="store_const",
        const=False,
        help="do not start ASR and the reply during pauses (wait for the end of the turn)",
    )
    add(
        VOICE,
        "--partials",
        dest="turn.partials",
        choices=["auto", "on", "off"],
        help="live transcript while you speak (auto: on with a CUDA ASR or 2 CPU cores or more)",
    )
    add(
        VOICE,
        "--partial-interval-ms",
        dest="turn.partial_interval_ms",
        type=int,
        metavar="MS",
        help="re-transcribe speech in progress this often for the live transcript (0: off)",
    )
    add(
        VOICE,
        "--first-chunk-words",
        dest="splitter.first_chunk_words",
        type=int,
        metavar="N",
        help="the reply's first spoken chunk may end after N words (0: wait for punctuation)",
    )
    add(
        VOICE,
        "--barge-in",
        dest="pipeline.barge_in",
        nargs="?",
        const="on",
        choices=("auto", "on", "off"),
        metavar="MODE",
        help="let speech interrupt the reply: auto (default: while echo cancellation works), "
        "on (alone: also without it, e.g. a headset) or off",
    )
    add(
        VOICE,
        "--echo",
        dest="echo.enabled",
        choices=("auto", "on", "off"),
        help="echo cancellation of the microphone: auto (default: where it loads), on (fail "
        "without it) or off (half duplex: the microphone is not heard while a reply plays)",
    )
    add(
        VOICE,
        "--metrics-port",
        dest="metrics.port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port (default 0: off; docs/monitoring.md)",
    )
    add(
        VOICE,
        "--metrics-host",
        dest="metrics.host",
        metavar="ADDR",
        help="address the metrics bind (default 127.0.0.1; another is reachable from the network)",
    )
    parser.add_argument("-v", "--verbose", action="count", help="log more (-vv for debug)")

"""The command line's flags and subcommands (argparse), for ``assistant.__main__``.

Each setting's flag has ``dest="section.key"``: the value overrides that key of the settings
tree (:mod:`assistant.config`), and :func:`flag_names` lets errors name the flag.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def _common(parser: argparse.ArgumentParser) -> None:
    from assistant.stages.llm import BACKENDS

    # SUPPRESS: an unset flag leaves no attribute, so `assistant --model X chat` keeps X.
    parser.argument_default = argparse.SUPPRESS
    g = parser.add_argument_group("settings (override the config file and ASSISTANT_* variables)")
    g.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings file (default ~/.config/assistant/config.toml)",
    )
    g.add_argument(
        "--store", dest="models.store_dir", metavar="DIR", help="model store (default ~/.cache/assistant)"
    )
    g.add_argument(
        "--model",
        dest="models.llm",
        metavar="NAME|DIR|FILE.gguf|hf:ORG/NAME[@REV]",
        help="LLM: store name, local Hugging Face folder, a GGUF file or a folder holding one "
        "(converted once into the store), or hf:org/name[@revision] (downloaded once into the "
        "store, online, pinned to a commit)",
    )
    g.add_argument(
        "--backend",
        dest="decoder.backend",
        choices=BACKENDS,
        help="decoder backend (default auto: TensorRT on a GPU it supports, its engine built once and "
        "checked by the accuracy gate, else the next backend, saying why)",
    )
    g.add_argument(
        "--llm-server",
        dest="decoder.server",
        metavar="HOST:PORT",
        help="decode on 'assistant serve' there (Triton, gRPC); mic, ASR and TTS stay here",
    )
    g.add_argument("--device", dest="decoder.device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--dtype", dest="decoder.dtype", choices=["auto", "fp32", "fp16", "bf16"])
    g.add_argument(
        "--cuda-graph", dest="decoder.cuda_graph", choices=["auto", "on", "off"], help="replay CUDA graphs"
    )
    g.add_argument(
        "--compile", dest="decoder.compile", action="store_const", const=True, help="torch.compile the graphs"
    )
    g.add_argument(
        "--context-tokens",
        dest="decoder.context_tokens",
        type=int,
        metavar="N",
        help="KV cache size in tokens",
    )
    g.add_argument("--threads", dest="decoder.threads", type=int, metavar="N", help="CPU threads (0 = auto)")
    g.add_argument("--max-new-tokens", dest="generation.max_new_tokens", type=int, metavar="N")
    g.add_argument("--temperature", dest="generation.temperature", type=float, metavar="T", help="0 = greedy")
    g.add_argument("--top-k", dest="generation.top_k", type=int, metavar="K")
    g.add_argument("--top-p", dest="generation.top_p", type=float, metavar="P")
    g.add_argument("--repetition-penalty", dest="generation.repetition_penalty", type=float, metavar="X")
    g.add_argument("--seed", dest="generation.seed", type=int, metavar="N")
    g.add_argument("--system-prompt", dest="dialogue.system_prompt", metavar="TEXT")
    g.add_argument(
        "--mic", dest="audio.input_device", metavar="DEVICE", help="input device: index or name part"
    )
    g.add_argument(
        "--speaker", dest="audio.output_device", metavar="DEVICE", help="output device: index or name part"
    )
    g.add_argument(
        "--asr-model",
        dest="asr.model",
        metavar="NAME|DIR",
        help="Whisper model (default whisper-tiny.en): store name, CTranslate2 folder; the torch backend "
        "also takes a Hugging Face folder or hf:org/name",
    )
    g.add_argument("--asr-device", dest="asr.device", metavar="DEVICE", help="auto, cpu, cuda")
    g.add_argument(
        "--asr-backend",
        dest="asr.backend",
        choices=["auto", "ctranslate2", "torch"],
        help="ASR runtime: ctranslate2 (faster-whisper), torch (transformers: GPUs CTranslate2 cannot use), "
        "auto (default: torch on CUDA when CTranslate2 has no CUDA)",
    )
    g.add_argument(
        "--asr-window",
        dest="asr.window",
        choices=["fit", "full"],
        help="Whisper's input: fit (default: max(--asr-floor-s, speech + 0.5 s), falling back to the "
        "30 s window when the decode looks wrong; CTranslate2 backend) or full (always 30 s)",
    )
    g.add_argument(
        "--asr-floor-s",
        dest="asr.floor_s",
        type=float,
        metavar="S",
        help="shortest window of --asr-window fit, seconds (default 10; 1 to 30)",
    )
    g.add_argument(
        "--tts",
        dest="tts.engine",
        choices=["pyttsx3", "piper"],
        help="text to speech: pyttsx3 (espeak-ng, default) or piper (natural voice, opt-in: scripts/setup.sh "
        "--piper; falls back to pyttsx3, saying why)",
    )
    g.add_argument(
        "--piper-voice",
        dest="tts.piper_voice",
        metavar="NAME|FILE.onnx",
        help="Piper voice (default en_US-joe-medium)",
    )
    g.add_argument(
        "--tts-threads",
        dest="tts.threads",
        type=int,
        metavar="N",
        help="Piper's CPU threads (default 1; 0: one per core)",
    )
    g.add_argument(
        "--voice", dest="tts.voice", metavar="VOICE", help="pyttsx3 voice (id or name part, e.g. en-us)"
    )
    g.add_argument(
        "--tts-rate", dest="tts.rate_wpm", type=int, metavar="WPM", help="speaking rate, words per minute"
    )
    g.add_argument(
        "--end-silence-ms",
        dest="vad.end_silence_ms",
        type=int,
        metavar="MS",
        help="silence that ends a turn with --turn-detection off",
    )
    g.add_argument(
        "--turn-detection",
        dest="turn.detection",
        choices=["smart-turn", "off"],
        help="end of turn: the Smart Turn model (default), or off: fixed --end-silence-ms",
    )
    g.add_argument(
        "--pause-ms", dest="turn.pause_ms", type=int, metavar="MS", help="silence before the model scores"
    )
    g.add_argument(
        "--max-silence-ms",
        dest="turn.max_silence_ms",
        type=int,
        metavar="MS",
        help="silence that ends a turn whatever the model says",
    )
    g.add_argument(
        "--no-speculation",
        dest="turn.speculate",
        action="store_const",
        const=False,
        help="do not start ASR and the reply during pauses (wait for the end of the turn)",
    )
    g.add_argument(
        "--partials",
        dest="turn.partials",
        choices=["auto", "on", "off"],
        help="live transcript while you speak (auto: on unless ASR runs on 2 CPU cores or fewer)",
    )
    g.add_argument(
        "--partial-interval-ms",
        dest="turn.partial_interval_ms",
        type=int,
        metavar="MS",
        help="re-transcribe speech in progress this often for the live transcript (0: off)",
    )
    g.add_argument(
        "--first-chunk-words",
        dest="splitter.first_chunk_words",
        type=int,
        metavar="N",
        help="the reply's first spoken chunk may end after N words (0: wait for punctuation)",
    )
    g.add_argument(
        "--barge-in",
        dest="pipeline.barge_in",
        action="store_const",
        const=True,
        help="let speech interrupt the reply (use a headset: with speakers it hears itself)",
    )
    g.add_argument(
        "--metrics-port",
        dest="metrics.port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port (default 0: off; docs/monitoring.md)",
    )
    g.add_argument(
        "--metrics-host",
        dest="metrics.host",
        metavar="ADDR",
        help="address the metrics bind (default 127.0.0.1; another is reachable from the network)",
    )
    parser.add_argument("-v", "--verbose", action="count", help="log more (-vv for debug)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree for every subcommand."""
    from assistant.modes.engine import add_engine_parsers
    from store.bundled import BUNDLED

    parser = argparse.ArgumentParser(
        prog="assistant",
        description="Local low-latency voice assistant. Without a subcommand: the terminal UI.",
    )
    _common(parser)
    # SUPPRESS on both: `assistant --export-dir X run` keeps X (the subparser's default would win).
    parser.add_argument(
        "--export-dir",
        type=Path,
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="UI: where 'e' writes the latency report (default .)",
    )
    sub = parser.add_subparsers(dest="command")
    chat = sub.add_parser("chat", help="text chat on stdin/stdout with a latency line per turn")
    _common(chat)
    run = sub.add_parser("run", help="the voice loop: in the UI, or headless (--no-tui, or --output)")
    run.add_argument(
        "--input", type=Path, metavar="WAV", help="answer the question in this WAV file, then exit"
    )
    run.add_argument("--output", type=Path, metavar="WAV", help="with --input: write the spoken reply here")
    run.add_argument(
        "--log", type=Path, metavar="JSONL", help="append one JSON line per turn (latency record)"
    )
    run.add_argument(
        "--events", type=Path, metavar="JSONL", help="append every pipeline event, timestamped, one per line"
    )
    run.add_argument("--no-tui", action="store_true", help="live microphone and speaker, events on stdout")
    run.add_argument(
        "--export-dir",
        type=Path,
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="UI: where 'e' writes the latency report",
    )
    _common(run)
    devices = sub.add_parser("devices", help="list audio input and output devices")
    _common(devices)
    models = sub.add_parser("models", help="bundled models: fetch, list, verify")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    fetch = models_sub.add_parser("fetch", help="download and convert the bundled models")
    default = ", ".join(n for n, m in BUNDLED.items() if not m.optional)
    fetch.add_argument("names", nargs="*", help=f"default: {default}, and the Piper voice with --tts piper")
    fetch.add_argument("--force", action="store_true", help="fetch again even when present")
    fetch.add_argument(
        "--check",
        action="store_true",
        help="download nothing: hash every file of the fetched models against the sha256 recorded "
        "at fetch time (exit status 1 when one is damaged or cannot be verified)",
    )
    _common(fetch)
    listing = models_sub.add_parser("list", help="models in the store with sizes")
    _common(listing)
    verify = models_sub.add_parser(
        "verify",
        help="hash every byte of every stored model and cache (ONNX exports, TensorRT engines) "
        "against its record: a table of OK/DAMAGED with the fix (exit status 1 on damage)",
    )
    _common(verify)
    serve = sub.add_parser(
        "serve", help="serve the LLM to many stations: Triton Inference Server, in-flight batching"
    )
    _common(serve)  # first: its SUPPRESS default applies to the flags below too
    serve.add_argument("--host", dest="serve.host", metavar="ADDR", help="listen here (default 127.0.0.1)")
    serve.add_argument("--port", dest="serve.port", type=int, metavar="PORT", help="gRPC port (default 8001)")
    serve.add_argument(
        "--sequences",
        dest="serve.sequences",
        type=int,
        metavar="N",
        help="conversations decoded together, each keeping its prefix (default 16)",
    )
    serve.add_argument(
        "--queue-delay-us",
        dest="serve.queue_delay_us",
        type=int,
        metavar="US",
        help="Triton's dynamic batcher: wait this long to admit requests together (default 100)",
    )
    add_engine_parsers(sub, _common)
    sub.add_parser(
        "bench",
        help="benchmarks: bench [NAME] ARGS runs bench.NAME (default decoder; bench list, bench NAME --help)",
        add_help=False,
    )
    return parser


def flag_names(parser: argparse.ArgumentParser) -> dict[str, str]:
    """``{"section.key": "--flag"}`` for every setting that has a flag (for error messages)."""
    return {
        a.dest: max(a.option_strings, key=len)
        for a in parser._actions  # argparse has no public list of a parser's arguments
        if "." in a.dest and a.option_strings
    }

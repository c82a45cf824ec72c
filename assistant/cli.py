"""The command line's flags and subcommands (argparse), for ``assistant.__main__``.

Each setting's flag has ``dest="section.key"``: the value overrides that key of the settings
tree (:mod:`assistant.config`), and :func:`flag_names` lets errors name the flag.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from assistant.cli_settings import settings_flags

MAX_INPUT_MINUTES_RANGE = (0.0, 1440.0)  # above 0, at most a day


def _minutes(text: str) -> float:
    """``--max-input-minutes``: a number of minutes above 0 and at most a day."""
    low, high = MAX_INPUT_MINUTES_RANGE
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes") from None
    if not low < value <= high:
        raise argparse.ArgumentTypeError(f"{text} is out of range: above {low:g}, at most {high:g} minutes")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree for every subcommand."""
    from assistant.modes.engine import add_engine_parsers
    from assistant.stages.audio_file import DEFAULT_MAX_INPUT_MINUTES
    from store.bundled import BUNDLED

    parser = argparse.ArgumentParser(
        prog="assistant",
        description="Local low-latency voice assistant. Without a subcommand: the terminal UI.",
    )
    settings_flags(parser)
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
    settings_flags(chat, "chat")
    run = sub.add_parser("run", help="the voice loop: in the UI, or headless (--no-tui, or --output)")
    run.add_argument(
        "--input", type=Path, metavar="WAV", help="answer the question in this WAV file, then exit"
    )
    run.add_argument("--output", type=Path, metavar="WAV", help="with --input: write the spoken reply here")
    run.add_argument(
        "--max-input-minutes",
        type=_minutes,
        default=DEFAULT_MAX_INPUT_MINUTES,
        metavar="MIN",
        help=f"refuse an --input file longer than this (default {DEFAULT_MAX_INPUT_MINUTES:g})",
    )
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
    settings_flags(run, "run")
    devices = sub.add_parser("devices", help="list audio input and output devices")
    settings_flags(devices, "devices")
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
    settings_flags(fetch, "models")
    listing = models_sub.add_parser("list", help="models in the store with sizes")
    settings_flags(listing, "models")
    verify = models_sub.add_parser(
        "verify",
        help="hash every byte of every stored model and cache (ONNX exports, TensorRT engines) "
        "against its record: a table of OK/DAMAGED with the fix (exit status 1 on damage)",
    )
    settings_flags(verify, "models")
    serve = sub.add_parser(
        "serve", help="serve the LLM to many stations: Triton Inference Server, in-flight batching"
    )
    settings_flags(serve, "serve")  # first: its SUPPRESS default applies to the flags below too
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
    serve.add_argument(
        "--prefill-chunk",
        dest="serve.prefill_chunk",
        type=int,
        metavar="TOKENS",
        help="prompt tokens of newcomers each decode step carries; 0: prefill between steps (default 1024)",
    )
    add_engine_parsers(sub, partial(settings_flags, command="engine"))
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


def parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``; a settings flag the subcommand does not read is named as such.

    argparse would say ``unrecognized arguments: --barge-in`` for ``serve --barge-in``; this
    says which commands read the flag (exit status 2, as argparse's errors).
    """
    args, extra = parser.parse_known_args(argv)
    if extra:
        flag = extra[0].split("=", 1)[0]
        command = getattr(args, "command", None) or ""
        command += f" {getattr(args, f'{command}_command', '')}".rstrip() if command else ""
        readers: dict[str, None] = {}  # ordered: "run", "models ..." (any of its subcommands)
        for name, sub in _subcommands(parser):
            if flag in sub._option_string_actions:
                readers[f"'assistant {name.split()[0]}{' ...' if ' ' in name else ''}'"] = None
        if command and readers:
            parser.error(
                f"'{command}' does not read {flag}: it is a setting of 'assistant', {', '.join(readers)} "
                f"('assistant {command} --help' lists what '{command}' takes)"
            )
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """``[("run", its parser), ("models fetch", ...), ...]``: every (nested) subcommand."""
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:  # argparse has no public list of subparsers
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _subcommands(sub)
                found += [(f"{name} {n}", s) for n, s in nested] if nested else [(name, sub)]
    return found

"""Command line: ``assistant [chat | run | serve | devices | models fetch|list | engine ... | bench]``.

Without a subcommand it opens the terminal UI (``assistant.tui``); ``chat`` is the text REPL.

Builds settings, then the stages; ``bench [NAME]`` hands its arguments to ``bench.NAME`` (``bench.decoder``).
Everything a user can get wrong on the command line (paths, settings, a context too small
for the prompt) is checked before any model loads. Only the standard library is imported at
the top, so that Ctrl-C at any point of the start-up ends quietly (:func:`main`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    from assistant.app import Session
    from assistant.config import Settings

logger = logging.getLogger("assistant")


def _bench(argv: list[str]) -> int:
    """Run ``bench.NAME``'s ``main`` with the rest of ``argv`` (``bench`` ships with the package)."""
    import bench  # lazily: only 'assistant bench' needs it

    return bench.run(argv)


def _settings(args: argparse.Namespace, flags: Mapping[str, str]) -> Settings:
    from assistant.config import load_settings

    overrides = {k: v for k, v in vars(args).items() if "." in k}
    return load_settings(getattr(args, "config", None), overrides=overrides, flags=flags)


def _check_output_args(args: argparse.Namespace) -> None:
    """Flags that make sense only together, and every path the app will write.

    Raises:
        UnwritablePath: A file or folder named by a flag cannot be written.
        ValueError: ``--output`` without ``--input``.
    """
    from store.files import check_writable_dir, check_writable_file

    output: Path | None = getattr(args, "output", None)
    if output is not None and getattr(args, "input", None) is None:
        raise ValueError(
            f"--output {output} needs --input: it writes the spoken reply to the question in the "
            "--input WAV file; add --input QUESTION.wav, or drop --output for the live voice loop"
        )
    for flag in ("output", "log", "events"):
        path = getattr(args, flag, None)
        if path is not None:
            check_writable_file(path, f"--{flag}")
    export_dir = getattr(args, "export_dir", None)
    if export_dir is not None:
        check_writable_dir(export_dir, "--export-dir")


def _check_context(settings: Settings, flags: Mapping[str, str]) -> None:
    """Refuse a context too small for the prompt, with the tokenizer only (no model loads)."""
    from assistant.modes.preflight import check_context
    from assistant.stages.llm import load_tokenizer, resolve_llm_dir

    check_context(settings, lambda: load_tokenizer(resolve_llm_dir(settings.models)), flags)


def _models(args: argparse.Namespace, settings: Settings) -> int:
    from store.bundled import BUNDLED, ModelStore

    store = ModelStore(settings.models.store_dir)
    # By default the models every run needs; the Piper voice too when it is configured or present.
    piper = settings.tts.piper_voice if settings.tts.engine == "piper" else ""
    default = [n for n, m in BUNDLED.items() if not m.optional or n == piper]
    if args.models_command == "fetch" and args.check:
        intact = True
        present = [n for n, m in BUNDLED.items() if m.optional and n not in default and store.is_present(n)]
        for name in args.names or default + present:
            ok, line = store.verify(name)
            intact &= ok
            print(line)
        return 0 if intact else 1
    if args.models_command == "fetch":
        for name in args.names or default:
            store.fetch(name, force=args.force)
        return 0
    stored = store.list()
    if not stored:
        print(f"no models in {store.models_dir}; run 'assistant models fetch'")
    for m in stored:
        print(f"{m.name:28} {m.kind:4} {m.size_bytes / 1e6:8.1f} MB  {m.source:28} {m.path}")
    missing = [n for n in BUNDLED if not store.is_present(n)]
    if missing:
        names = [n + (" (optional)" if BUNDLED[n].optional else "") for n in missing]
        print(f"bundled but not fetched: {', '.join(names)}")
    if any(BUNDLED[n].kind == "tts" for n in missing):
        print("the Piper voice is for --tts piper: scripts/setup.sh --piper installs it and piper-tts")
    return 0


def _chat(settings: Settings) -> int:
    from assistant.modes.chat import run_chat
    from assistant.stages.dialogue import Dialogue
    from assistant.stages.llm import load_llm

    if settings.metrics.port:
        print(
            "notice: chat serves no metrics (it keeps no turn records); --metrics-port works with "
            "'assistant', 'assistant run' and 'run --no-tui', where typed turns are counted too",
            file=sys.stderr,
        )
    decoder, tokenizer = load_llm(
        settings.models,
        settings.decoder,
        settings.engine,
        gate=settings.gate,
        notice=lambda line: print(f"notice: {line}", file=sys.stderr),
    )
    options = settings.generation.options()
    try:
        return run_chat(Dialogue(decoder, tokenizer, settings.dialogue.system_prompt, options))
    finally:
        decoder.close()  # TensorRT saves its runtime cache here


def _serve(settings: Settings) -> int:
    from assistant.modes.serve import run_server, serve_options
    from assistant.stages.llm import resolve_llm_dir

    model_dir = resolve_llm_dir(settings.models)
    return run_server(serve_options(model_dir, settings.decoder, settings.serve), settings.serve)


def _devices() -> int:
    from assistant.stages.devices import list_devices

    devices = list_devices()
    if not devices:
        print("no audio devices found")
    for d in devices:
        marks = ("*in " if d.is_default_input else "") + ("*out" if d.is_default_output else "")
        print(
            f"{d.index:3} {d.name:40} in {d.inputs:2}  out {d.outputs:2}  {d.default_rate_hz:7.0f} Hz {marks}"
        )
    return 0


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from assistant.stages.asr import load_wav
    from assistant.stages.vad import find_utterance

    input_wav: Path | None = getattr(args, "input", None)
    output: Path | None = getattr(args, "output", None)
    audio = load_wav(input_wav) if input_wav else None  # a bad file fails before models load
    if input_wav is not None and audio is not None:
        find_utterance(audio, settings.vad, input_wav)  # so does a file without speech
    if not getattr(args, "no_tui", False) and output is None:
        return _tui(args, settings)
    return _headless(args, settings, input_wav, audio, output)


def _headless(
    args: argparse.Namespace,
    settings: Settings,
    input_wav: Path | None,
    audio: np.ndarray | None,
    output: Path | None,
) -> int:
    from assistant.app import build_session
    from assistant.modes.run import ConsoleReporter, fan_out
    from assistant.observe.latency import EventLog
    from assistant.observe.metrics import serving

    events_path: Path | None = getattr(args, "events", None)
    event_log = EventLog(events_path) if events_path else None
    file_mode = input_wav is not None and audio is not None
    try:
        with serving(settings.metrics) as metrics:
            session = build_session(
                settings,
                devices=not file_mode,
                asr=True if file_mode else None,
                tts=True if file_mode else None,
                emit=fan_out(ConsoleReporter(), event_log, metrics),
                log_path=getattr(args, "log", None),
                engine_events=metrics.engine_event if metrics else None,
            )
            if metrics is not None:
                asr_model = session.transcriber.description if session.transcriber else ""
                metrics.attach(session.dialogue.decoder, settings.models.llm, asr_model)
            return _serve_session(session, settings, input_wav, audio, output)
    finally:
        if event_log:
            event_log.close()


def _serve_session(
    session: Session,
    settings: Settings,
    input_wav: Path | None,
    audio: np.ndarray | None,
    output: Path | None,
) -> int:
    """Answer the file's question, or run the live loop (text chat without devices); closes ``session``."""
    from assistant.modes.chat import run_chat
    from assistant.modes.run import run_file, run_live

    for notice in session.notices:
        print(f"notice: {notice}", file=sys.stderr)
    try:
        if input_wav is not None and audio is not None:
            record = run_file(session.pipeline, settings.vad, audio, input_wav, output, session.turn_policy)
            return 0 if not record.cancelled else 1
        if session.mic is None or session.speaker is None:
            return run_chat(session.dialogue)
        mic, speaker = session.mic, session.speaker
        session.mic = session.speaker = None  # run_live closes them
        return run_live(session.pipeline, mic, speaker, session.endpointer(), session.settings_turn)
    finally:
        session.close()


def _tui(args: argparse.Namespace, settings: Settings) -> int:
    from assistant.tui import run_tui

    return run_tui(
        settings,
        input_wav=getattr(args, "input", None),
        log_path=getattr(args, "log", None),
        events_path=getattr(args, "events", None),
        export_dir=getattr(args, "export_dir", None) or Path.cwd(),
    )


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``assistant`` console script.

    Ctrl-C while the app starts (imports, model loading) ends it with one line and status
    130, not a traceback; once running, each mode handles Ctrl-C itself. SIGTERM becomes
    ``SystemExit(143)`` in the main thread, so a terminated command unwinds like Ctrl-C does:
    sessions close, temporary folders go (``run_live`` and the UI take SIGTERM over for their
    own clean stop).
    """
    argv = sys.argv[1:] if argv is None else argv
    try:
        if threading.current_thread() is not threading.main_thread():
            return _main(argv)
        previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            return _main(argv)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    from assistant.cli import build_parser, flag_names
    from assistant.modes.offline import hub_requested, stay_offline

    if argv[:1] == ["bench"]:  # its own flags: argparse would reject them here
        stay_offline()
        return _bench(argv[1:])
    from assistant.config import ConfigError
    from assistant.modes.engine import run_engine
    from models.weights import CorruptModel, ModelNotFound
    from store.bundled import FetchError

    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(getattr(args, "verbose", 0), 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        flags = flag_names(parser)
        settings = _settings(args, flags)
        stay_offline(hub=hub_requested(settings))  # before onnxruntime or a Hugging Face library loads
        if args.command in (None, "run"):
            _check_output_args(args)
        if args.command in (None, "chat", "run"):
            _check_context(settings, flags)
        if args.command == "serve":
            return _serve(settings)
        if settings.decoder.server and args.command in (None, "chat", "run"):
            print(f"decoding on the LLM server {settings.decoder.server}", file=sys.stderr)
        elif settings.decoder.backend == "auto" and args.command in (None, "chat", "run"):
            from assistant.stages.llm import resolve_auto_backend

            # Said before the models load; the setting stays "auto", so the load can fall back
            # from TensorRT when its engine fails (and say why).
            chosen, reason = resolve_auto_backend(settings.decoder)
            print(f"backend auto: {chosen.backend} ({reason})", file=sys.stderr)
        if args.command == "models":
            return _models(args, settings)
        if args.command == "engine":
            return run_engine(args, settings)
        if args.command == "devices":
            return _devices()
        if args.command == "run":
            return _run(args, settings)
        if args.command == "chat":
            return _chat(settings)
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            print("notice: not a terminal, so no UI: text chat", file=sys.stderr)
            return _chat(settings)
        return _tui(args, settings)
    except (ConfigError, ModelNotFound, CorruptModel, FetchError, ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

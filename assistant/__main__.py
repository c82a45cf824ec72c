"""Command line: ``assistant [chat | run | serve | devices | models fetch|list | engine ... | bench]``.

Without a subcommand it opens the terminal UI (``assistant.tui``); ``chat`` is the text REPL.

Argument parsing and dispatch only: it builds the settings, runs the checks of
:mod:`assistant.modes.preflight` (paths, the ``--input`` question, a context too small for the
prompt) before any model loads, and hands over to the subcommand's mode in
:mod:`assistant.modes` (or the UI, :mod:`assistant.tui`; ``bench [NAME]``: the ``bench`` package).
Only the standard library is imported at the top, and each mode only when it runs, so that
Ctrl-C at any point of the start-up ends quietly (:func:`main`).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from assistant.config import Settings

logger = logging.getLogger("assistant")


def _settings(args: argparse.Namespace, flags: Mapping[str, str]) -> Settings:
    from assistant.config import load_settings

    overrides = {k: v for k, v in vars(args).items() if "." in k}
    return load_settings(getattr(args, "config", None), overrides=overrides, flags=flags)


def _check_context(settings: Settings, flags: Mapping[str, str]) -> None:
    """Refuse a context too small for the prompt, with the tokenizer only (no model loads)."""
    from assistant.modes.preflight import check_context
    from assistant.stages.llm import resolve_llm_config
    from assistant.stages.tokenizer import load_tokenizer

    check_context(settings, lambda: load_tokenizer(resolve_llm_config(settings.models).path), flags)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    from assistant.modes.preflight import check_question
    from assistant.stages.audio_file import DEFAULT_MAX_INPUT_MINUTES

    input_wav: Path | None = getattr(args, "input", None)
    output: Path | None = getattr(args, "output", None)
    minutes = getattr(args, "max_input_minutes", None) or DEFAULT_MAX_INPUT_MINUTES
    audio = check_question(input_wav, settings.vad, minutes)  # a bad file fails before models load
    if not getattr(args, "no_tui", False) and output is None:
        return _tui(args, settings, audio)
    from assistant.modes.run import run_headless

    events: Path | None = getattr(args, "events", None)
    return run_headless(settings, input_wav, audio, output, events, getattr(args, "log", None))


def _tui(args: argparse.Namespace, settings: Settings, audio: np.ndarray | None = None) -> int:
    from assistant.tui import run_tui

    return run_tui(
        settings,
        input_wav=getattr(args, "input", None),
        input_audio=audio,
        log_path=getattr(args, "log", None),
        events_path=getattr(args, "events", None),
        export_dir=getattr(args, "export_dir", None) or Path.cwd(),
    )


_signalled: list[int] = []  # the stop signals received, in case their SystemExit was swallowed


REDELIVER_MAX = 10  # a stop signal's exit swallowed this often in a row is given up on
REDELIVER_AFTER_S = 0.01  # time for the finalizer that swallowed the exit to return


def _exit_on_signal(signum: int, _frame: object) -> None:
    """Unwind the main thread with ``SystemExit(128 + signum)``.

    Raised inside a finalizer (``__del__``, a weakref callback), the exception is printed as
    "Exception ignored" and dropped: :func:`_quiet_swallowed_exit` then delivers the signal again.
    """
    _signalled.append(signum)
    raise SystemExit(128 + signum)


def _quiet_swallowed_exit(unraisable: Any) -> None:
    """``sys.unraisablehook``: our own swallowed ``SystemExit`` is delivered again, quietly.

    Dropped, the exit let the command go on: a file-mode turn finished and exited 0 (CI), and
    a command waiting on something (``assistant serve`` on its Triton server) would wait on.
    (The serve hang CI saw had another cause: the signal taken by another thread while the main
    one sat in ``waitpid``; :func:`assistant.modes.serve.wait_for_exit`.) A timer thread sends
    the signal to the main thread again 10 ms later:
    sent from here, inside the finalizer, its handler would run at once and be swallowed again;
    later it runs once the finalizer has returned, and interrupts a blocking wait too. Starting
    that thread waits for it to run: on a busy machine the signal can come back before this hook
    returns (a CI run), where its exit would be dropped too ("Exception ignored in
    sys.unraisablehook"); then it is caught here and sent once more.
    """
    if not (isinstance(unraisable.exc_value, SystemExit) and _signalled):
        sys.__unraisablehook__(unraisable)
        return
    main = threading.main_thread().ident
    assert main is not None
    while len(_signalled) <= REDELIVER_MAX:
        again = threading.Timer(REDELIVER_AFTER_S, signal.pthread_kill, (main, _signalled[-1]))
        again.name = "signal-again"
        try:
            again.start()  # it only sends the signal: nothing to join
            return
        except SystemExit:
            continue  # it came back while the sender started: send it again


# SIGHUP (the terminal was closed) ends a command as SIGTERM does, with its clean-up; it used to
# kill it on the spot, leaving its temporary folders. Under nohup (SIGHUP ignored) it stays ignored.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``assistant`` console script.

    Ctrl-C while the app starts (imports, model loading) ends it with one line and status
    130, not a traceback; once running, each mode handles Ctrl-C itself. SIGTERM becomes
    ``SystemExit(143)`` in the main thread, and SIGHUP ``SystemExit(129)``, so a terminated
    command unwinds like Ctrl-C does: sessions close, temporary folders go (``run_live`` and the
    UI take both over for their own clean stop).
    """
    argv = sys.argv[1:] if argv is None else argv
    try:
        if threading.current_thread() is not threading.main_thread():
            return _main(argv)
        previous = {
            s: signal.signal(s, _exit_on_signal)
            for s in STOP_SIGNALS
            if signal.getsignal(s) is not signal.SIG_IGN
        }
        _signalled.clear()
        sys.unraisablehook = _quiet_swallowed_exit
        try:
            status = _main(argv)
        finally:
            sys.unraisablehook = sys.__unraisablehook__
            for s, handler in previous.items():
                if handler is not None:
                    signal.signal(s, handler)
        return 128 + _signalled[0] if _signalled else status
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    from assistant.cli import build_parser, flag_names, parse_command_line
    from assistant.modes.offline import hub_requested, stay_offline

    if argv[:1] == ["bench"]:  # its own flags: argparse would reject them here
        from assistant.modes.bench import bench_command

        stay_offline()
        return bench_command(argv[1:])
    from assistant.config import ConfigError
    from assistant.modes.engine import run_engine
    from assistant.modes.preflight import check_output_args
    from models.files import CorruptModel, ModelNotFound
    from store.bundled import FetchError

    parser = build_parser()
    args = parse_command_line(parser, argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(getattr(args, "verbose", 0), 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        flags = flag_names(parser)
        settings = _settings(args, flags)
        stay_offline(hub=hub_requested(settings))  # before onnxruntime or a Hugging Face library loads
        if args.command in (None, "run"):
            check_output_args(args)
        if args.command in (None, "chat", "run"):
            _check_context(settings, flags)
        if args.command == "serve":
            from assistant.modes.serve import serve_command

            return serve_command(settings)
        if settings.decoder.server and args.command in (None, "chat", "run"):
            print(f"decoding on the LLM server {settings.decoder.server}", file=sys.stderr)
        elif settings.decoder.backend == "auto" and args.command in (None, "chat", "run"):
            from assistant.stages.llm import resolve_auto_backend

            # Said before the models load; the setting stays "auto", so the load can fall back
            # from TensorRT when its engine fails (and say why).
            chosen, reason = resolve_auto_backend(settings.decoder)
            print(f"backend auto: {chosen.backend} ({reason})", file=sys.stderr)
        if args.command == "models":
            from assistant.modes.models import run_models

            return run_models(args, settings)
        if args.command == "engine":
            return run_engine(args, settings)
        if args.command == "devices":
            from assistant.modes.devices import devices_command

            return devices_command()
        if args.command == "run":
            return _run(args, settings)
        if args.command == "chat" or not (sys.stdin.isatty() and sys.stdout.isatty()):
            from assistant.modes.chat import chat_command

            if args.command != "chat":
                print("notice: not a terminal, so no UI: text chat", file=sys.stderr)
            return chat_command(settings)
        return _tui(args, settings)
    except (ConfigError, ModelNotFound, CorruptModel, FetchError, ValueError, OSError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

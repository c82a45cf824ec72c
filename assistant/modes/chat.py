"""``assistant chat``: a text REPL that streams replies and prints one latency line per turn."""

from __future__ import annotations

import io
import sys
import threading
from typing import TYPE_CHECKING, TextIO

from assistant.stages.dialogue import Dialogue, Reply
from engines.serving.remote import ServerUnavailable

if TYPE_CHECKING:
    from assistant.config import Settings


def stats_line(reply: Reply) -> str:
    """``[ttft 41 ms | 18.3 tok/s | 12 tokens | prompt 96: 21 prefilled, 75 reused | eos]``."""
    s = reply.stats
    ttft = "n/a" if s.ttft_ms is None else f"{s.ttft_ms:.0f} ms"
    return (
        f"[ttft {ttft} | {s.decode_tokens_per_s:.1f} tok/s | "
        f"{s.generated_tokens} tokens | prompt {s.prompt_tokens}: {s.prefilled_tokens} prefilled, "
        f"{s.reused_tokens} reused | {s.stop_reason.value if s.stop_reason else '?'}"
        + ("" if s.network_ms is None else f" | network {s.network_ms:.0f} ms")
        + "]"
    )


NOT_UTF8 = "(input not valid UTF-8: its bad bytes are read as \ufffd; set the terminal to UTF-8)"


def _as_utf8(line: str) -> str:
    """``line`` with bytes that were not UTF-8 (read as surrogate escapes) replaced by U+FFFD."""
    return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def run_chat(dialogue: Dialogue, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    """Read lines until EOF; Ctrl-C stops the current reply, a second Ctrl-C at the prompt quits.

    A line that is not valid UTF-8 is answered with its bad bytes replaced (and a notice).
    """
    if isinstance(stdin, io.TextIOWrapper):
        stdin.reconfigure(errors="surrogateescape")  # else one bad byte ends the chat
    interactive = stdin.isatty()
    stdout.write(f"assistant ready ({dialogue.decoder.name}); type a message, Ctrl-D to quit\n")
    while True:
        if interactive:
            stdout.write("> ")
            stdout.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt:
            stdout.write("\n")
            return 0
        if not line:
            return 0
        text = _as_utf8(line).strip()
        if text != line.strip():
            stdout.write(NOT_UTF8 + "\n")
        if not text:
            continue
        cancel = threading.Event()
        reply = dialogue.ask(text, cancel)
        for notice in reply.plan.notices():
            stdout.write(f"({notice})\n")
        try:
            for chunk in reply:
                stdout.write(chunk.text)
                stdout.flush()
        except KeyboardInterrupt:
            cancel.set()
            stdout.write(" [interrupted]")
        except ServerUnavailable as e:  # --llm-server: the next message connects again
            stdout.write(f" [{e}; the next message connects again]")
        stdout.write("\n" + stats_line(reply) + "\n")
        stdout.flush()


def chat_command(settings: Settings) -> int:
    """``assistant chat``: load the decoder, answer typed lines until the input ends, close it."""
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
        # The streams of the moment, not those of import time (a test may have replaced them).
        return run_chat(
            Dialogue(decoder, tokenizer, settings.dialogue.system_prompt, options), sys.stdin, sys.stdout
        )
    finally:
        decoder.close()  # TensorRT saves its runtime cache here

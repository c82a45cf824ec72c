"""A reply that carries terminal escape sequences reaches no terminal, voice or history with them.

The real bundled tokenizer encodes a reply with OSC ``ESC ]0;title BEL`` (retitles the
window), CSI ``ESC [2J`` (clears the screen), the one-character C1 CSI (U+009B) and a carriage
return; a scripted step model (a stand-in for a rogue ``--llm-server``, which sends token ids
of its choosing) makes the real :class:`~engines.driver.DecoderDriver` generate exactly those
tokens. The real :class:`~assistant.stages.dialogue.Dialogue` and ``chat`` loop take it from there.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence

import numpy as np

from assistant.modes.chat import run_chat
from assistant.stages.dialogue import Dialogue
from engines.base import Backend, BackendIdentity, GenerationOptions
from engines.driver import DecoderDriver, strip_controls

HOSTILE = "Sure.\x1b]0;pwned\x07 Done\x1b[2J here\x9b2J.\r\n\tNext line."
CLEAN = "Sure.]0;pwned Done[2J here2J.\n\tNext line."
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class ScriptedStep:
    """A step model whose logits always pick the next id of ``script`` (then the end token)."""

    name = "scripted"
    capacity_tokens = 4096
    identity = BackendIdentity(Backend.REMOTE)

    def __init__(self, script: Sequence[int], vocab: int, eos: int) -> None:
        self.script, self.vocab, self.eos = list(script), vocab, eos
        self.given = 0

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        logits = np.full(self.vocab, -50.0, np.float32)
        logits[self.script[self.given] if self.given < len(self.script) else self.eos] = 50.0
        self.given += 1
        return logits

    def close(self) -> None:
        pass


def hostile_dialogue(tokenizer) -> Dialogue:
    ids = tokenizer.encode(HOSTILE, add_special_tokens=False)
    assert tokenizer.decode(ids) == HOSTILE  # the tokenizer can say every one of these bytes
    eos = tokenizer.eos_token_id
    driver = DecoderDriver(ScriptedStep(ids, len(tokenizer), eos), tokenizer, [eos])
    return Dialogue(driver, tokenizer, "", GenerationOptions(max_new_tokens=len(ids) + 1))


def test_strip_controls_keeps_newline_and_tab_only():
    assert strip_controls(HOSTILE) == CLEAN
    assert strip_controls("a\x00b\x7fc\x85d\u2028e\u00a0f") == "abcd\u2028e\u00a0f"  # printable kept


def test_the_decoders_text_holds_no_escape_sequences(tokenizer):
    """Every chunk the UI, TTS and the headless reporter get, the stats and the history: clean."""
    dialogue = hostile_dialogue(tokenizer)
    reply = dialogue.ask("hello")
    chunks = [c.text for c in reply]
    assert "".join(chunks) == CLEAN
    assert not any(CONTROLS.search(c.replace("\n", "").replace("\t", "")) for c in chunks)
    assert reply.stats.text == CLEAN
    assert dialogue.transcript[-1].assistant == CLEAN.strip()


def test_chat_prints_the_reply_without_escape_sequences(tokenizer):
    out = io.StringIO()
    assert run_chat(hostile_dialogue(tokenizer), io.StringIO("hello\n"), out) == 0
    printed = out.getvalue()
    assert CLEAN in printed
    assert "\x1b" not in printed and "\x07" not in printed and "\x9b" not in printed and "\r" not in printed

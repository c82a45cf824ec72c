"""Long conversations and bad chat input, as a user meets them (issue #8, defects 4 and 5)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.llm import make_decoder, make_dialogue, run_reply
from tests.helpers.paths import ROOT

pytestmark = pytest.mark.slow


def test_after_the_context_fills_the_next_turns_reuse_the_cache_again(model_dir, tokenizer):
    """A long session keeps its TTFT: after an overflow most of each prompt comes from the cache.

    Before the fix each turn past the first overflow dropped one more oldest turn, so only the
    system prompt was reused (``reused_tokens`` ~40 of ~400) for the rest of the session.
    """
    small = make_decoder(model_dir, tokenizer, capacity_tokens=256)
    dialogue = make_dialogue(small, tokenizer, max_new_tokens=12)
    reuse: list[float] = []
    overflowed_at = None
    for i in range(16):
        reply, _ = run_reply(dialogue, f"Question {i}: tell me one short fact about the number {i}.")
        if reply.plan.dropped_turns and overflowed_at is None:
            overflowed_at = i
        elif overflowed_at is not None:
            reuse.append(reply.stats.reused_tokens / reply.stats.prompt_tokens)
        assert dialogue.turns[-1].user.startswith(f"Question {i}:")  # the newest is always kept
    assert overflowed_at is not None and len(reuse) >= 6, (overflowed_at, reuse)
    # Turns after the first overflow: the prompt is the cached prefix plus the last exchange.
    high = sum(r >= 0.6 for r in reuse)
    assert high >= 0.6 * len(reuse), [round(r, 2) for r in reuse]


def chat(stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "assistant", "chat", "--backend", "pytorch", "--max-new-tokens", "8"],
        input=stdin,
        capture_output=True,
        cwd=ROOT,
        timeout=600,
    )


def test_bytes_that_are_not_utf8_on_stdin_are_replaced_and_the_chat_goes_on():
    done = chat(b"hi \xff there\nWhat is the capital of France?\n")
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    assert "Traceback" not in err
    assert "not valid UTF-8" in out and "\ufffd" in out
    assert out.count("[ttft") == 2  # both lines were answered

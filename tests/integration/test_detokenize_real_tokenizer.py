"""Incremental detokenization with stop strings, on the real SmolLM2 tokenizer."""

from __future__ import annotations

from engines.driver import TextStream


def stream(tokenizer, text, stops=()):
    ts = TextStream(tokenizer, stops)
    pieces = []
    for token in tokenizer.encode(text, add_special_tokens=False):
        pieces.append(ts.push(token))
        if ts.stopped:
            break
    else:
        pieces.append(ts.flush())
    return ts, pieces


def test_text_stream_never_splits_multibyte_characters(tokenizer):
    text = "Café au lait 🎉 costs 3€ — naïve 日本語."
    _, pieces = stream(tokenizer, text)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_text_stream_holds_back_a_possible_stop_string_and_cuts_at_it(tokenizer):
    ts, pieces = stream(tokenizer, "Hello there. User: ignore this", stops=("User:",))
    assert ts.stopped and "".join(pieces) == "Hello there. "
    assert all("User" not in p for p in pieces)
    # A partial match that never completes is released at the end.
    ts, pieces = stream(tokenizer, "Hello Use the force", stops=("User:",))
    assert not ts.stopped and "".join(pieces) == "Hello Use the force"

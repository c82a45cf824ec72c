"""Streaming generation, stops, cancellation and prefix reuse on the real SmolLM2 (CPU)."""

from __future__ import annotations

import threading

import pytest

from engines.base import ContextOverflow, GenerationOptions, StopReason
from tests.helpers.llm import make_dialogue, run_reply


def test_capital_of_france_answer_names_paris(fresh_decoder, tokenizer):
    reply, _ = run_reply(make_dialogue(fresh_decoder, tokenizer), "What is the capital of France?")
    assert "Paris" in reply.stats.text
    assert reply.stats.stop_reason is StopReason.EOS
    assert reply.stats.ttft_ms > 0 and reply.stats.t_first_token_ns >= reply.stats.t_submit_ns


def test_streamed_text_concatenates_to_the_reply(fresh_decoder, tokenizer):
    dialogue = make_dialogue(fresh_decoder, tokenizer, max_new_tokens=16)  # any length streams the same
    reply = dialogue.ask("Say hello in French and in Spanish.")
    chunks = list(reply)
    assert "".join(c.text for c in chunks) == reply.stats.text
    stamps = [c.t_ns for c in chunks]
    assert stamps == sorted(stamps)


def test_max_new_tokens_stops_exactly(fresh_decoder, tokenizer):
    reply, ids = run_reply(
        make_dialogue(fresh_decoder, tokenizer, max_new_tokens=5), "Tell me a long story about a dragon."
    )
    assert len(ids) == 5 and reply.stats.generated_tokens == 5
    assert reply.stats.stop_reason is StopReason.MAX_TOKENS


def test_stop_string_cuts_the_reply_before_it(fresh_decoder, tokenizer):
    question = "Tell me a long story about a dragon."
    # 20 tokens hold the 7 words needed (the cut run stops at the sixth); 40 only took longer.
    full, _ = run_reply(make_dialogue(fresh_decoder, tokenizer, max_new_tokens=20), question)
    words = full.stats.text.split()
    assert len(words) > 6
    stop = " " + words[5]
    expected = full.stats.text[: full.stats.text.index(stop)]
    fresh_decoder.reset()
    cut, _ = run_reply(
        make_dialogue(fresh_decoder, tokenizer, max_new_tokens=20, stop_strings=(stop,)), question
    )
    assert cut.stats.stop_reason is StopReason.STOP_STRING
    assert cut.stats.text == expected
    assert stop not in "".join(cut.stats.text)


def test_cancel_stops_generation_and_keeps_the_partial_reply(fresh_decoder, tokenizer):
    dialogue = make_dialogue(fresh_decoder, tokenizer, max_new_tokens=100)
    cancel = threading.Event()
    reply = dialogue.ask("Tell me a long story about a dragon.", cancel)
    seen = 0
    for _chunk in reply:
        seen += 1
        if seen == 4:
            cancel.set()
    assert reply.stats.stop_reason is StopReason.CANCELLED
    assert seen == 4
    assert dialogue.turns[-1].assistant == reply.stats.text.strip() != ""


def test_seeded_sampling_is_reproducible(fresh_decoder, tokenizer):
    def sample(seed):
        fresh_decoder.reset()
        d = make_dialogue(fresh_decoder, tokenizer, temperature=0.9, top_p=0.95, seed=seed, max_new_tokens=12)
        return run_reply(d, "Write a sentence about the sea.")[1]

    first = sample(7)
    assert sample(7) == first
    assert any(sample(s) != first for s in (8, 9, 10))


def test_prefix_reuse_gives_the_same_tokens_as_full_prefill_with_fewer_prefilled(fresh_decoder, tokenizer):
    questions = ["What is the capital of France?", "And what is it famous for?", "Thanks. Bye!"]

    def conversation(reuse: bool):
        fresh_decoder.reset()
        dialogue = make_dialogue(fresh_decoder, tokenizer, max_new_tokens=16)
        out = []
        for q in questions:
            if not reuse:
                fresh_decoder.reset()
            reply, ids = run_reply(dialogue, q)
            out.append((ids, reply.stats.prefilled_tokens, reply.stats.reused_tokens))
        return out

    reused, full = conversation(True), conversation(False)
    assert [r[0] for r in reused] == [f[0] for f in full]
    for (_, pre_r, re_r), (_, pre_f, re_f) in zip(reused[1:], full[1:], strict=True):
        assert re_f == 0 and re_r > 0
        assert pre_r < pre_f


@pytest.fixture(scope="module")
def small_decoder(model_dir, tokenizer):
    """The real SmolLM2 with a 256-token cache: what does not fit is cut after a few hundred tokens."""
    from tests.helpers.llm import make_decoder

    return make_decoder(model_dir, tokenizer, capacity_tokens=256)


def test_context_overflow_drops_oldest_turns_never_the_system_prompt(small_decoder, tokenizer):
    from assistant.stages.dialogue import Turn

    small = small_decoder
    small.reset()
    dialogue = make_dialogue(small, tokenizer, max_new_tokens=32)
    filler = "This is a long earlier message about the weather and the mountains. " * 4
    dialogue.turns = [Turn(f"turn {i}: {filler}", f"answer {i}") for i in range(6)]
    reply, _ = run_reply(dialogue, "What is the capital of France?")
    plan = reply.plan
    assert plan.dropped_turns > 0 and plan.user_tokens_cut == 0
    assert len(plan.ids) <= 256 - 32
    text = tokenizer.decode(plan.ids)
    assert dialogue.system_prompt in text
    assert "turn 0:" not in text and "turn 5:" in text  # oldest went first, newest stayed
    assert any("oldest turn" in n for n in plan.notices())
    assert [t.user for t in dialogue.turns][-1] == "What is the capital of France?"


def test_ten_thousand_word_paste_is_cut_to_fit_and_answered(small_decoder, tokenizer):
    """The cut is the same at any cache size; the 256-token cache spares a 2,000-token prefill."""
    small_decoder.reset()
    paste = ("lorem ipsum dolor sit amet " * 2000) + "What is the capital of France?"
    dialogue = make_dialogue(small_decoder, tokenizer, max_new_tokens=16)
    reply, ids = run_reply(dialogue, paste)
    assert reply.plan.user_tokens_cut > 0
    assert len(reply.plan.ids) <= small_decoder.capacity_tokens - 16
    assert "capital of France" in reply.plan.user_text  # the end (the question) is kept
    assert ids and any("too long" in n for n in reply.plan.notices())
    assert dialogue.transcript[-1].user == paste  # the session record keeps all of it


def test_prompt_longer_than_cache_raises_context_overflow(fresh_decoder):
    with pytest.raises(ContextOverflow, match="exceeds the KV cache"):
        fresh_decoder.prefill([1] * (fresh_decoder.capacity_tokens + 1))
    gen = fresh_decoder.generate([1] * (fresh_decoder.capacity_tokens + 1), GenerationOptions())
    with pytest.raises(ContextOverflow):
        list(gen)


def test_a_second_generation_while_one_is_open_is_refused_not_deadlocked(fresh_decoder, tokenizer):
    ids = tokenizer.encode("Hello there", add_special_tokens=False)
    first = iter(fresh_decoder.generate(ids, GenerationOptions(max_new_tokens=8)))
    next(first)
    with pytest.raises(RuntimeError, match="still running"):
        list(fresh_decoder.generate(ids, GenerationOptions(max_new_tokens=2)))
    first.close()
    assert len(list(fresh_decoder.generate(ids, GenerationOptions(max_new_tokens=2)))) == 2


def test_iterating_a_finished_reply_again_records_nothing_twice(fresh_decoder, tokenizer):
    dialogue = make_dialogue(fresh_decoder, tokenizer, max_new_tokens=4)
    reply, _ = run_reply(dialogue, "Hi!")
    assert list(reply) == []
    assert len(dialogue.turns) == len(dialogue.transcript) == 1

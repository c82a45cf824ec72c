"""ASR on a window fitted to the speech (``[asr] window = "fit"``), real tiny.en on espeak-ng speech.

The fitted window must hear a handful of short questions as well as Whisper's 30 s window
does, and a decode that looks wrong (a token bound too small for the speech, or a floor so
short that tiny.en repeats itself) must fall back to the 30 s window and be counted; a
partial transcript's gives no text instead.
"""

from __future__ import annotations

import difflib

import pytest

from assistant.stages import asr
from assistant.stages.asr import AsrOptions, Transcriber
from assistant.stages.asr_fit import FitWindow
from bench.corpus import SHORT_QUESTIONS, VOICES
from bench.speech import speak
from bench.wer import normalize
from store.bundled import ModelStore

pytestmark = pytest.mark.slow


def word_errors(reference: str, heard: str) -> int:
    """Words of the reference not matched in order by the transcript, or extra transcript words."""
    ref, hyp = normalize(reference).split(), normalize(heard).split()
    matched = sum(b.size for b in difflib.SequenceMatcher(a=ref, b=hyp, autojunk=False).get_matching_blocks())
    return max(len(ref), len(hyp)) - matched


@pytest.fixture(scope="module")
def questions(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fit-window")
    return [
        (text, speak(text, folder, f"q{i}", speed_wpm=VOICES[i % 5][1], voice=VOICES[i % 5][0]))
        for i, text in enumerate(SHORT_QUESTIONS[: len(VOICES)])  # a question in each voice
    ]


@pytest.fixture(scope="module")
def models(store: ModelStore) -> tuple[Transcriber, Transcriber]:
    store.fetch("whisper-tiny.en", progress=lambda _msg: None)
    full = Transcriber(AsrOptions(device="cpu", cpu_threads=2, window="full"), store)
    fit = Transcriber(AsrOptions(device="cpu", cpu_threads=2, window="fit", floor_s=10.0), store)
    return full, fit


def test_fitted_window_hears_short_questions_as_well_as_the_full_window(models, questions):
    full, fit = models
    full_errors = fit_errors = 0
    windows = []
    for text, audio in questions:
        a, b = full.transcribe(audio), fit.transcribe(audio)
        full_errors += word_errors(text, a.text)
        fit_errors += word_errors(text, b.text)
        windows.append(b.window)
        assert a.window == "full" and not a.fell_back
    assert fit_errors <= full_errors, (fit_errors, full_errors)
    assert windows.count("fit") >= len(questions) - 1  # the fitted window itself gave the text


def test_a_token_bound_too_small_falls_back_to_the_full_window(models, questions):
    _, fit = models
    text, audio = questions[0]  # "What is the capital of France?"
    before = fit.fallbacks
    fit.fit = FitWindow(floor_s=10.0, tokens_per_s=0.0, tokens_slack=2)
    try:
        r = fit.transcribe(audio)
    finally:
        fit.fit = FitWindow(floor_s=10.0)
    assert r.fell_back and r.window == "full"
    assert fit.fallbacks == before + 1
    assert word_errors(text, r.text) == 0, r.text  # the whole question, from the 30 s window


def test_a_partial_that_looks_wrong_gives_no_text_and_no_30_s_pass(models, questions):
    """The live transcript's pass stays short: its fallback ran on into the pause (~450 ms)."""
    _, fit = models
    _, audio = questions[0]
    before = fit.fallbacks
    fit.fit = FitWindow(floor_s=10.0, tokens_per_s=0.0, tokens_slack=2)  # every decode hits its bound
    try:
        partial, judged = fit.transcribe(audio, partial=True), fit.transcribe(audio, quick=True)
    finally:
        fit.fit = FitWindow(floor_s=10.0)
    assert partial.text == "" and partial.window == "fit" and not partial.fell_back
    assert judged.fell_back and judged.text  # words over a reply still get the 30 s window
    assert fit.fallbacks == before + 1  # the partial's was not counted


def test_a_floor_that_makes_tiny_en_repeat_itself_falls_back(store, questions):
    # With only 5 s of window tiny.en hears this question twice over ("What is the capital
    # and France? What is the capital and France?"): the repeat check sends it to 30 s.
    short = Transcriber(AsrOptions(device="cpu", cpu_threads=2, window="fit", floor_s=5.0), store)
    text, audio = questions[0]
    r = short.transcribe(audio)
    assert r.fell_back and short.fallbacks == 1
    assert normalize(r.text) == normalize(text)


def test_the_warm_up_takes_the_path_a_turn_takes(models, monkeypatch):
    """The fitted window warms up on itself (55 ms), not on the 30 s window (280 ms a start)."""
    full, fit = models
    windows: list[str] = []
    fitted, whole = asr.decode_fit, fit.model.transcribe

    def counted_fit(*args, **kwargs):
        windows.append("fit")
        return fitted(*args, **kwargs)

    def counted_whole(*args, **kwargs):
        windows.append("full")
        return whole(*args, **kwargs)

    monkeypatch.setattr(asr, "decode_fit", counted_fit)
    monkeypatch.setattr(fit.model, "transcribe", counted_whole)
    fit.warm_up()
    assert windows == ["fit"]
    windows.clear()
    monkeypatch.setattr(full.model, "transcribe", counted_whole)
    full.warm_up()
    assert windows == ["full"]

"""Fast unit tests: the fitted ASR window's size and token bound, when its decode falls back, and
what is kept when every temperature fails Whisper's checks (scripted decode results)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest

from assistant.config import ConfigError, load_settings
from assistant.config.sections import AsrOptions
from assistant.events import TranscriptReady
from assistant.modes.run import ConsoleReporter
from assistant.observe.latency import build_record
from assistant.observe.metrics import Metrics
from assistant.stages.asr_fit import (
    FitDecode,
    FitWindow,
    keep_first,
    passes,
    periodic,
    problem,
    repeated,
    sure_of_first,
    unclear,
)
from assistant.stages.asr_guard import GuardedWhisper


def decode(text: str = "What is the capital of France?", **changes: float) -> FitDecode:
    fields = {
        "tokens": 8,
        "max_new_tokens": 36,
        "avg_logprob": -0.2,
        "compression_ratio": 1.1,
        "no_speech_prob": 0.01,
        "frames": 1000,
    }
    return FitDecode(text=text, **{**fields, **changes})  # type: ignore[arg-type]


def test_window_is_the_floor_for_short_speech_and_speech_plus_32_frames_or_more_beyond_it():
    fit = FitWindow(floor_s=10.0)
    assert fit.frames(2 * 16000) == 1000  # 2 s of speech: the 10 s floor
    for seconds in (9.9, 12.0, 17.3):
        frames = fit.frames(int(seconds * 16000))
        assert frames >= seconds * 100 + 32 and frames % 2 == 0
    assert fit.frames(29 * 16000) == 2950 and fit.frames(29_900 * 16) == 3000  # never past 30 s
    assert FitWindow(floor_s=5.0).frames(16000) == 500


def test_token_bound_grows_with_the_audio():
    fit = FitWindow(tokens_per_s=10.0, tokens_slack=12)
    assert fit.max_new_tokens(16000) == 22
    assert fit.max_new_tokens(3 * 16000) == 42


def test_a_good_decode_is_kept():
    assert problem(decode()) is None


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (decode(tokens=36), "bound of 36 tokens"),
        (decode("What is the capital of France? What is the capital of France?"), "repeats"),
        (decode("Who wrote, wrote, wrote and Juliet."), "repeats 'wrote'"),
        (decode(compression_ratio=2.6), "compression ratio 2.60"),
        (decode(avg_logprob=-1.3), "log-probability -1.30"),
    ],
)
def test_a_decode_that_looks_wrong_falls_back_with_the_reason(bad, why):
    assert why in (problem(bad) or "")


def test_likely_silence_is_not_a_fallback():
    # faster-whisper's rule: no-speech probability over 0.6 and an unlikely decode is silence
    assert problem(decode("you", avg_logprob=-1.5, no_speech_prob=0.9)) is None
    assert "log-probability" in (problem(decode("you", avg_logprob=-1.5, no_speech_prob=0.3)) or "")


def test_repeats_are_loops_but_ordinary_speech_is_not():
    assert repeated("Set a timer for 10 minutes. Set a timer") == "set a timer"
    assert repeated("ha ha ha ha") == "ha"
    for ok in ("What is the capital of France?", "yes yes", "very very good", "Sentence number one"):
        assert repeated(ok) is None


def result(tokens: int = 120, no_speech: float = 0.1) -> SimpleNamespace:
    """A stand-in for CTranslate2's WhisperGenerationResult: only the fields the checks read."""
    return SimpleNamespace(sequences_ids=[list(range(tokens))], no_speech_prob=no_speech)


def test_repetitive_speech_keeps_the_confident_temperature_0_decode():
    # The 85 s recording: ratio 3.6 at temperature 0 with log-prob -0.26; faster-whisper kept a
    # temperature-1.0 sample (log-prob -1.8) that its silence rule then dropped.
    first = (result(no_speech=0.78), -0.26, 0.0, 3.6)
    sampled = (result(no_speech=0.78), -1.85, 1.0, 1.9)
    text = "Sentence number six, the quick brown fox jumps over the lazy dog. " * 4
    assert not passes(first)
    assert passes(sampled)  # faster-whisper's silence rule would accept (and drop) it
    assert keep_first(first, sampled, text, 30.0, short=False)


def test_an_unlikely_temperature_0_is_kept_only_when_no_sample_is_likelier():
    heard = "Which river flows free?"
    assert keep_first((result(8), -1.3, 0.0, 1.0), (result(9), -1.6, 1.0, 1.1), heard, 2.0, short=True)
    assert not keep_first((result(8), -1.3, 0.0, 1.0), (result(9), -1.1, 1.0, 2.6), heard, 2.0, short=True)


def test_a_loop_is_not_kept_and_a_passing_fallback_wins():
    sampled = (result(), -1.4, 1.0, 2.9)
    loop = (result(tokens=440), -0.1, 0.0, 9.0)
    assert not keep_first(loop, sampled, "la " * 440, 30.0, short=False)  # more tokens than 30 s hold
    twice = "You're welcome, you're welcome, you're welcome."
    assert not keep_first((result(12), -0.3, 0.0, 2.5), sampled, twice, 2.4, short=True)
    assert keep_first((result(12), -0.3, 0.0, 2.5), sampled, twice, 2.4, short=False)  # long form: may repeat
    assert not keep_first((result(), -0.3, 0.0, 3.0), (result(), -0.5, 0.4, 1.5), "text", 30.0, short=False)


SENTENCES = " ".join(
    f"Sentence number {n}. The quick brown fox jumps over the lazy dog near the river bank."
    for n in ("one", "two", "three", "four", "five")
)


def test_a_loop_is_a_stretch_said_three_times_word_for_word_and_varied_repetition_is_not():
    assert periodic("ha ha ha") == "ha"
    assert periodic("I think so. " + "Thank you for watching. " * 3) == "thank you for watching"
    assert periodic("Sentence number six, the quick brown fox jumps over the lazy dog. " * 4) is not None
    for speech in (SENTENCES, "yes yes", "What is the capital of France?", "one two three four five six"):
        assert periodic(speech) is None, speech


def test_confident_repetitive_speech_keeps_temperature_0_without_sampling():
    first = (result(no_speech=0.78), -0.26, 0.0, 3.6)  # the 85 s recording's window
    assert sure_of_first(first, SENTENCES, 30.0, short=False)
    assert not sure_of_first(first, "Thank you for watching. " * 5, 30.0, short=False)  # a loop
    assert not sure_of_first((result(), -1.2, 0.0, 3.6), SENTENCES, 30.0, short=False)  # unlikely
    assert not sure_of_first((result(tokens=440), -0.2, 0.0, 3.6), SENTENCES, 30.0, short=False)  # too long
    assert not sure_of_first((result(12), -0.3, 0.0, 2.5), "Set a timer, set a timer.", 2.4, short=True)


@dataclass(frozen=True)
class Options:
    """The two fields of faster-whisper's ``TranscriptionOptions`` that the guard reads."""

    temperatures: tuple[float, ...]
    without_timestamps: bool


def guarded(monkeypatch, first: tuple, sampled: tuple) -> tuple[GuardedWhisper, list[list[float]]]:
    """A ``GuardedWhisper`` whose faster-whisper fallback is scripted, noting the temperatures asked."""
    asked: list[list[float]] = []

    def fallback(self, encoder_output, prompt, tokenizer, options):
        asked.append(list(options.temperatures))
        return first if options.temperatures[0] == 0.0 else sampled

    monkeypatch.setattr("faster_whisper.WhisperModel.generate_with_fallback", fallback)
    return object.__new__(GuardedWhisper), asked


def test_the_guard_samples_no_temperature_for_confident_repetitive_speech(monkeypatch):
    first, sampled = (result(no_speech=0.78), -0.26, 0.0, 3.6), (result(), -1.85, 1.0, 1.9)
    options = Options((0.0, 0.2, 0.4, 0.6, 0.8, 1.0), without_timestamps=False)
    tokenizer = SimpleNamespace(decode=lambda _ids: SENTENCES)
    model, asked = guarded(monkeypatch, first, sampled)
    assert model.generate_with_fallback(None, [], tokenizer, options) == first
    assert asked == [[0.0]]
    tokenizer = SimpleNamespace(decode=lambda _ids: "Thank you for watching. " * 5)  # a loop: sampled
    model, asked = guarded(monkeypatch, first, sampled)
    model.generate_with_fallback(None, [], tokenizer, options)
    assert asked == [[0.0], [0.2, 0.4, 0.6, 0.8, 1.0]]


def test_segments_of_a_window_every_decode_failed_are_unclear():
    seg = SimpleNamespace(compression_ratio=1.8, avg_logprob=-1.6, temperature=1.0)
    assert unclear(seg)
    assert not unclear(SimpleNamespace(compression_ratio=3.6, avg_logprob=-0.26, temperature=0.0))  # kept
    assert not unclear(SimpleNamespace(compression_ratio=1.5, avg_logprob=-0.8, temperature=1.0))  # passed


def test_window_setting_is_checked_and_floor_has_a_range(tmp_path):
    with pytest.raises(ValueError, match="window = 'short': choose fit or full"):
        AsrOptions(window="short")
    cfg = tmp_path / "config.toml"
    cfg.write_text('[asr]\nwindow = "fit"\nfloor_s = 5.0\n')
    asr = load_settings(cfg, env={}).asr
    assert (asr.window, asr.floor_s) == ("fit", 5.0)
    cfg.write_text("[asr]\nfloor_s = 0.2\n")
    with pytest.raises(ConfigError, match="floor_s"):
        load_settings(cfg, env={})


def test_the_turn_record_shows_the_window_a_fallback_and_what_could_not_be_transcribed():
    ready = TranscriptReady(3, 10, "hello", 80.0, (), "full", True, ((29.0, 35.0),))
    record = build_record(3, [ready])
    assert (record.asr_window, record.asr_fell_back, record.unclear_s) == ("full", True, [[29.0, 35.0]])
    assert '"asr_fell_back":true' in record.to_json()
    out = io.StringIO()
    ConsoleReporter(out)(ready)
    assert "[turn 3] 29.0-35.0 s could not be transcribed (left out)" in out.getvalue()


def test_prometheus_counts_transcripts_by_window_and_fallback():
    metrics = Metrics()
    for window, fell_back in (("fit", False), ("fit", False), ("full", True)):
        metrics.observe(build_record(1, [TranscriptReady(1, 5, "hi", 90.0, (), window, fell_back)]))
    scrape = generate_latest(metrics.registry).decode()
    assert 'assistant_asr_transcripts_total{fell_back="false",window="fit"} 2.0' in scrape
    assert 'assistant_asr_transcripts_total{fell_back="true",window="full"} 1.0' in scrape

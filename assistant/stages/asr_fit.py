"""Whisper on a window that fits the speech, and the checks that send a doubtful decode back.

faster-whisper pads every utterance to Whisper's 30 s window: tiny.en's encoder then runs on
3000 mel frames (~450 ms on 2 CPU threads) for a 2 s question. CTranslate2 takes shorter
encoder inputs (OpenNMT/CTranslate2 #1446), so :func:`decode_fit` computes the features with
faster-whisper's own extractor, encodes ``max(floor, speech + margin)`` frames and decodes
with faster-whisper's prompt and suppressed tokens. Cropped to the speech alone tiny.en
looped; a floor of a few seconds of silence and some frames of context after the speech
(futo-org/whisper-acft #5: at least 32) keep it on track, and a token bound proportional to
the audio stops a loop early (SYSTRAN/faster-whisper #1006). :func:`problem` says when the
decode looks wrong (the bound reached, too repetitive, too unlikely), and the caller then
transcribes on the full window instead (counted: ``TranscriptResult.fell_back``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

SAMPLES_PER_FRAME = 160  # Whisper's mel hop: 10 ms at 16 kHz
FULL_FRAMES = 3000  # Whisper's 30 s window
MARGIN_FRAMES = 50  # context after the speech; futo-org/whisper-acft #5 asks for at least 32
TOKENS_PER_S = 10.0  # fast speech is ~4 words (~6 tokens) a second; a loop runs far past this
TOKENS_SLACK = 12  # numbers and names take several tokens each: room for a short utterance
# faster-whisper's own thresholds (TranscriptionOptions defaults)
COMPRESSION_RATIO_MAX = 2.4
LOG_PROB_MIN = -1.0
NO_SPEECH_MIN = 0.6
LAST_TEMPERATURE = 1.0  # the last of faster-whisper's fallback temperatures


@dataclass(frozen=True)
class FitWindow:
    """How big the window is and how long the decode may run.

    ``floor_s``: the window is never shorter than this (tiny.en loops on speech alone).
    ``margin_frames``: 10 ms frames of context after the speech. The decode may produce
    ``tokens_per_s`` tokens a second of audio plus ``tokens_slack``; reaching that bound
    counts as a loop.
    """

    floor_s: float = 10.0
    margin_frames: int = MARGIN_FRAMES
    tokens_per_s: float = TOKENS_PER_S
    tokens_slack: int = TOKENS_SLACK

    def frames(self, samples: int) -> int:
        """Encoder frames for ``samples`` of 16 kHz audio: even, at most the full window."""
        speech = math.ceil(samples / SAMPLES_PER_FRAME) + self.margin_frames
        frames = max(round(self.floor_s * 100), speech)
        return min(FULL_FRAMES, frames + frames % 2)  # the encoder's stride-2 convolution

    def max_new_tokens(self, samples: int) -> int:
        """The decode's token bound for ``samples`` of 16 kHz audio."""
        return self.tokens_slack + math.ceil(self.tokens_per_s * samples / 16000)


@dataclass(frozen=True)
class FitDecode:
    """One decode on the fitted window, with what faster-whisper's checks look at."""

    text: str
    tokens: int
    max_new_tokens: int
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    frames: int


def silent(d: FitDecode) -> bool:
    """faster-whisper's no-speech rule: likely silence and an unlikely decode (text dropped)."""
    return d.no_speech_prob > NO_SPEECH_MIN and d.avg_logprob < LOG_PROB_MIN


def repeated(text: str) -> str | None:
    """A phrase of 3 words said twice, or a word or two said three times in a row: a loop.

    The short window's typical failure ("What is the capital of France? What is the capital
    of France?", "Who wrote, wrote, wrote ..."), too short for the compression ratio to see.
    With beam search a bounded decode may end at a shorter finished hypothesis rather than at
    the bound, so this check, not the bound alone, catches a loop cut short. Real speech that
    repeats itself only costs the full window's time.
    """
    words = re.findall(r"[\w']+", text.lower())
    seen: dict[tuple[str, ...], int] = {}
    for i in range(len(words) - 2):
        gram = tuple(words[i : i + 3])
        if gram in seen and i - seen[gram] >= 3:
            return " ".join(gram)
        seen.setdefault(gram, i)
    for n in (1, 2):
        for i in range(len(words) - 3 * n + 1):
            if words[i : i + n] == words[i + n : i + 2 * n] == words[i + 2 * n : i + 3 * n]:
                return " ".join(words[i : i + n])
    return None


def problem(d: FitDecode) -> str | None:
    """Why the decode looks wrong (then the full window transcribes), or ``None`` to keep it."""
    if silent(d):
        return None
    if d.tokens >= d.max_new_tokens:
        return f"reached the bound of {d.max_new_tokens} tokens"
    if loop := repeated(d.text):
        return f"repeats {loop!r}"
    if d.compression_ratio > COMPRESSION_RATIO_MAX:
        return f"compression ratio {d.compression_ratio:.2f} > {COMPRESSION_RATIO_MAX}"
    if d.avg_logprob < LOG_PROB_MIN:
        return f"average log-probability {d.avg_logprob:.2f} < {LOG_PROB_MIN}"
    return None


def decode_fit(
    model: Any,
    samples: np.ndarray,
    beam_size: int,
    fit: FitWindow,
    language: str | None,
    encoded: tuple[Any, int] | None = None,
) -> FitDecode:
    """Encode ``fit.frames`` of ``samples`` and decode without timestamps, through CTranslate2.

    Args:
        model: A loaded ``faster_whisper.WhisperModel`` (its extractor, tokenizer, CTranslate2 model).
        samples: 16 kHz mono float32, at most 30 s.
        beam_size: 1 decodes greedily.
        fit: The window and the token bound.
        language: The language code; ``None`` takes English (no detection on a short window).
        encoded: :func:`encode_fit`'s output for ``samples``, when the caller has it.

    Returns:
        The text and the numbers :func:`problem` judges it by.
    """
    from faster_whisper.transcribe import get_compression_ratio, get_suppressed_tokens

    encoded, frames = encoded or encode_fit(model, samples, fit)
    tokenizer = _tokenizer(model, language)
    prompt = model.get_prompt(tokenizer, [], without_timestamps=True)
    max_new = fit.max_new_tokens(samples.size)
    result = model.model.generate(
        encoded,
        [prompt],
        beam_size=beam_size,
        max_length=len(prompt) + max_new,
        return_scores=True,
        return_no_speech_prob=True,
        suppress_blank=True,
        suppress_tokens=get_suppressed_tokens(tokenizer, [-1]),
    )[0]
    tokens = result.sequences_ids[0]
    text = tokenizer.decode(tokens).strip()
    avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)  # faster-whisper's, length penalty 1
    return FitDecode(
        text=text,
        tokens=len(tokens),
        max_new_tokens=max_new,
        avg_logprob=float(avg_logprob),
        compression_ratio=get_compression_ratio(text) if text else 0.0,
        no_speech_prob=float(result.no_speech_prob),
        frames=frames,
    )


def encode_fit(model: Any, samples: np.ndarray, fit: FitWindow) -> tuple[Any, int]:
    """The encoder output (StorageView) for ``fit.frames`` of ``samples``, and the frames."""
    import ctranslate2

    frames = fit.frames(samples.size)
    # The features faster-whisper computes, zero-padded as its pad_or_trim does, to fewer frames
    # (padding the audio with silence instead read no better on the corpus).
    features = model.feature_extractor(samples)[:, :frames]
    features = np.pad(features, ((0, 0), (0, frames - features.shape[1])))
    encoded = model.model.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None])))
    return encoded, frames


def _tokenizer(model: Any, language: str | None) -> Any:
    from faster_whisper.tokenizer import Tokenizer

    multilingual = model.model.is_multilingual
    return Tokenizer(model.hf_tokenizer, multilingual, task="transcribe", language=language or "en")


def phrase_logprobs(
    model: Any,
    samples: np.ndarray,
    fit: FitWindow,
    phrases: list[str],
    language: str | None,
    encoded: tuple[Any, int] | None = None,
) -> list[float]:
    """How likely each of ``phrases`` is as the transcript of ``samples``: mean log-probability a token.

    Forced decoding through CTranslate2's ``align`` (the pass faster-whisper's word timestamps
    make): Whisper's probability of each token of `` phrase`` given the audio and the tokens
    before it, on the fitted window (``encoded``: :func:`encode_fit`'s output for ``samples``,
    when the caller has it). A phrase Whisper would write scores near its own greedy decode; an
    unrelated one several nats a token below (docs/voice.md, "Full duplex").
    """
    encoded, frames = encoded or encode_fit(model, samples, fit)
    tokenizer = _tokenizer(model, language)
    start = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
    speech_frames = min(frames, samples.size // SAMPLES_PER_FRAME)
    scores = []
    for phrase in phrases:
        tokens = tokenizer.encode(" " + phrase.strip())
        probs = np.asarray(model.model.align(encoded, start, [tokens], speech_frames)[0].text_token_probs)
        scores.append(float(np.log(np.maximum(probs, 1e-12)).mean()) if probs.size else -math.inf)
    return scores


# What faster-whisper keeps when every temperature fails (assistant.stages.asr_guard)


def passes(decode: tuple[Any, float, float, float], silence_passes: bool = True) -> bool:
    """faster-whisper's checks on one ``(result, avg_logprob, temperature, compression_ratio)``.

    A likely-silent window with an unlikely decode passes (faster-whisper stops falling back and
    drops it) unless ``silence_passes`` is false.
    """
    result, avg_logprob, _, ratio = decode
    if silence_passes and result.no_speech_prob > NO_SPEECH_MIN and avg_logprob < LOG_PROB_MIN:
        return True
    return ratio <= COMPRESSION_RATIO_MAX and avg_logprob >= LOG_PROB_MIN


def keep_first(
    first: tuple[Any, float, float, float],
    rest: tuple[Any, float, float, float],
    text: str,
    audio_s: float,
    short: bool,
) -> bool:
    """Whether the temperature-0 decode ``first`` (its ``text``) wins over the others' pick ``rest``.

    Only when ``rest`` failed the checks too. Then ``first`` is kept when it is the most likely
    decode (confident, or at least as likely as the sampled pick: faster-whisper preferred any
    sample under the compression threshold, however unlikely) and not a loop: no more tokens
    than ``audio_s`` of speech can hold, and for a ``short`` utterance (one window without
    timestamps) no phrase said over again (:func:`repeated`). A sampled decode is unlikely by
    nature, so faster-whisper's "silence" rule must not let it overrule a confident temperature 0.
    """
    if passes(rest, silence_passes=False):
        return False
    return not looped(first, text, audio_s, short) and first[1] >= min(LOG_PROB_MIN, rest[1])


def sure_of_first(first: tuple[Any, float, float, float], text: str, audio_s: float, short: bool) -> bool:
    """Whether the temperature-0 decode ``first`` is kept without sampling the other temperatures.

    When it failed the checks only for compressing too well (repetitive speech) and is
    confident, within the token bound and no loop by :func:`looped`, where no stretch may be
    said three times over word for word. Genuinely repetitive speech still varies ("Sentence
    number one. The quick brown fox ... Sentence number two. The quick brown fox ..."), a
    decoder's loop does not. Sampling five more temperatures, best of 5 each, cost ~10 s of a
    30 s window on 2 cores and could only swap the likeliest decode for a less likely one.
    """
    _, avg_logprob, _, ratio = first
    repetitive = ratio > COMPRESSION_RATIO_MAX and avg_logprob >= LOG_PROB_MIN
    return repetitive and not looped(first, text, audio_s, short) and periodic(text) is None


def looped(first: tuple[Any, float, float, float], text: str, audio_s: float, short: bool) -> bool:
    """More tokens than ``audio_s`` of speech can hold, or (a ``short`` utterance) a phrase said twice."""
    if len(first[0].sequences_ids[0]) > TOKENS_SLACK + TOKENS_PER_S * audio_s:
        return True
    return short and repeated(text) is not None


def periodic(text: str, times: int = 3) -> str | None:
    """A stretch of words said ``times`` times in a row, word for word (a decoder's loop), or ``None``."""
    words = re.findall(r"[\w']+", text.lower())
    for period in range(1, len(words) // times + 1):
        run = 0  # words so far equal to the word a period later
        for i in range(len(words) - period):
            run = run + 1 if words[i] == words[i + period] else 0
            if run >= (times - 1) * period:
                first = i + 1 - run
                return " ".join(words[first : first + period])
    return None


def unclear(segment: Any, last_temperature: float = LAST_TEMPERATURE) -> bool:
    """A segment of a window whose every decode failed the checks (faster-whisper's fallback pick)."""
    failed = segment.compression_ratio > COMPRESSION_RATIO_MAX or segment.avg_logprob < LOG_PROB_MIN
    return failed and segment.temperature >= last_temperature > 0

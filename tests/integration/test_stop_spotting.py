"""Stop requests whose words the echo canceller mangled are still heard as stop requests.

Real tiny.en (both backends) on espeak-ng speech. Under a playing reply AEC3's double-talk
suppression takes a stretch out of the user's words ("Please stop." came out "Please come."
on the echo rig): here 250 ms in the middle of "Hold on." are taken down 35 dB, which
tiny.en writes as "Oh, God." (150 ms of "Please stop." 25 dB down gives "Please up", which
its words alone now count as a stop request). Scoring the stop phrases against those words
(``Hearing.transcribe_overlap``) finds the request; real words that are not one are kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from assistant.events import OverlapVerdict
from assistant.stages.asr import AsrOptions, Transcriber
from assistant.turns.hearing import Hearing
from assistant.turns.overlap_words import judge
from bench.duplex_rig import utterance
from bench.stop_spotting import suppressed_middle
from store.bundled import ModelStore

pytestmark = pytest.mark.slow


def spoken(folder: Path, text: str) -> np.ndarray:
    samples, _rate = soundfile.read(utterance(folder, text, text.split()[-1].strip(".?")), dtype="float32")
    return samples


@pytest.fixture(scope="module")
def asr(store: ModelStore) -> Transcriber:
    store.fetch("whisper-tiny.en", progress=lambda _msg: None)
    return Transcriber(AsrOptions(device="cpu", cpu_threads=2), store)


def test_a_stop_request_with_its_middle_suppressed_is_heard_as_one(asr: Transcriber, tmp_path: Path) -> None:
    audio = suppressed_middle(spoken(tmp_path, "Hold on."), ms=250, db=-35)
    greedy = asr.transcribe(audio, quick=True).text
    assert judge(greedy) is OverlapVerdict.BARGE_IN, greedy  # mangled: the words alone are no stop request
    assert Hearing(asr, lambda _event: None).transcribe_overlap(audio).text == "Hold on.", greedy


def test_please_stop_with_its_middle_suppressed_is_a_stop_request_by_its_words(
    asr: Transcriber, tmp_path: Path
) -> None:
    heard = (
        Hearing(asr, lambda _event: None)
        .transcribe_overlap(suppressed_middle(spoken(tmp_path, "Please stop.")))
        .text
    )
    assert judge(heard) is OverlapVerdict.STOP, heard


@pytest.mark.parametrize(
    "text", ["Please continue.", "Please come here.", "What about Rome?", "Tell me more."]
)
def test_words_that_are_no_stop_request_are_kept(asr: Transcriber, tmp_path: Path, text: str) -> None:
    hearing = Hearing(asr, lambda _event: None)
    for audio in (spoken(tmp_path, text), suppressed_middle(spoken(tmp_path, text))):
        heard = hearing.transcribe_overlap(audio).text
        assert judge(heard) is not OverlapVerdict.STOP, heard


def test_scores_rank_the_words_said_first(asr: Transcriber, tmp_path: Path) -> None:
    """Forced decoding: the phrase said scores highest, a one-word change several nats a token lower."""
    said, other, unrelated = asr.phrase_logprobs(
        spoken(tmp_path, "Please stop."), ["Please stop.", "Please come.", "What is the capital of Germany?"]
    )
    assert said > other + 1.5 and other > unrelated, (said, other, unrelated)
    assert asr.phrase_logprobs(np.zeros(800, np.float32), ["Stop."]) == [-np.inf]  # 50 ms: no word


def test_scoring_reuses_the_encoding_the_words_were_decoded_from(
    asr: Transcriber, tmp_path: Path, monkeypatch
) -> None:
    """The overlap judge transcribes, then scores the same audio: one encoder pass, not two."""
    import assistant.stages.asr_fit as asr_fit

    audio = spoken(tmp_path, "Please stop.")
    asr.transcribe(audio, quick=True)
    encoded_again = []
    monkeypatch.setattr(asr_fit, "encode_fit", lambda *args: encoded_again.append(args))
    assert asr.phrase_logprobs(audio, ["Please stop."])[0] > -1.5
    assert encoded_again == []

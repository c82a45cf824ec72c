"""The voice pipeline's rules with scripted stages: held speech, speculation, what was heard.

The stages are small stand-ins that follow the protocols in :mod:`assistant.turns.protocols`
(a real :class:`~assistant.stages.dialogue.Dialogue` over a scripted decoder, the real
sentence splitter); each records what it was asked, so the tests check the order of the work
as well as its result. Real models and devices are the integration tests' part.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pytest

from assistant.config.sections import SplitterOptions
from assistant.events import (
    AudioStarted,
    CancelReason,
    Event,
    PartialTranscript,
    SentenceReady,
    SpeculationDiscarded,
    SpeechEnded,
    TranscriptReady,
    TurnCancelled,
    TurnDone,
    TurnHeld,
)
from assistant.stages.asr import WINDOW_S, TranscriptResult
from assistant.stages.devices import DeviceLostError
from assistant.stages.dialogue import Dialogue
from assistant.stages.splitter import SentenceSplitter
from assistant.turns.actions import Start
from assistant.turns.pipeline import VoicePipeline
from assistant.turns.protocols import PipelineOptions, ReplyGate
from assistant.turns.runs import TurnRuns
from engines.base import Backend, BackendIdentity, GenerationOptions, GenerationStats, StopReason, TokenChunk
from engines.serving.remote import ServerUnavailable

RATE = 16000


@dataclass
class ScriptedAsr:
    """Hears ``texts`` in turn (the last one repeats); records the audio it was given."""

    texts: list[str]
    description: str = "scripted-asr"
    heard: list[tuple[int, bool, bool]] = field(default_factory=list)  # (samples, quick, long_form)
    gate: threading.Event | None = None  # when set, transcribing waits for it

    def transcribe(
        self, audio: np.ndarray, quick: bool = False, long_form: bool = False, partial: bool = False
    ) -> TranscriptResult:
        if self.gate is not None:
            self.gate.wait(5)
        self.heard.append((audio.size, quick, long_form))
        text = self.texts[min(len(self.heard) - 1, len(self.texts) - 1)]
        return TranscriptResult(text, 1000 * audio.size / RATE, 5.0, "en", 0.0)


class WordTokenizer:
    """A chat template and tokenizer of whole words (enough for the dialogue's bookkeeping)."""

    def apply_chat_template(self, messages: list[dict], tokenize: bool, add_generation_prompt: bool) -> str:
        return " ".join(f"<{m['role']}> {m['content']}" for m in messages) + " <assistant>"

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [len(w) for w in text.split()]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return " ".join("x" * i for i in ids)


@dataclass
class ScriptedGeneration:
    words: list[str]
    cancel: threading.Event | None
    fail_after: int | None
    before_word: Callable[[], None] | None = None
    stats: GenerationStats = field(default_factory=GenerationStats)

    def __iter__(self) -> Iterator[TokenChunk]:
        self.stats.t_submit_ns = time.monotonic_ns()
        for i, word in enumerate(self.words):
            if self.before_word is not None:
                self.before_word()
            if self.cancel is not None and self.cancel.is_set():
                self.stats.stop_reason = StopReason.CANCELLED
                return
            if self.fail_after is not None and i == self.fail_after:
                raise ServerUnavailable("the LLM server at localhost:8001 stopped answering")
            text = word if i == 0 else " " + word
            self.stats.text += text
            self.stats.generated_tokens += 1
            yield TokenChunk(i, i + 1, text, time.monotonic_ns())
        self.stats.stop_reason = StopReason.EOS


@dataclass
class ScriptedDecoder:
    """Replies ``reply``; ``fail_after``: the served decoder's server goes away after that many words;
    ``before_word`` is called before each word is generated."""

    reply: str
    fail_after: int | None = None
    before_word: Callable[[], None] | None = None
    name: str = "scripted"
    capacity_tokens: int = 4096
    prompts: list[list[int]] = field(default_factory=list)
    identity: BackendIdentity = BackendIdentity(Backend.PYTORCH, "cpu", "fp32")
    fallback: str = ""
    cache_status: str = "nothing to cache"
    cached_ids: tuple[int, ...] = ()

    def close(self) -> None:
        """Nothing to free."""

    def generate(
        self, prompt_ids: Sequence[int], options: GenerationOptions, cancel=None
    ) -> ScriptedGeneration:
        self.prompts.append(list(prompt_ids))
        return ScriptedGeneration(self.reply.split(), cancel, self.fail_after, self.before_word)


class ScriptedVoice:
    """Speaks 0.1 s of audio a word, one piece per sentence."""

    description = "scripted-voice"

    def stream(self, text: str) -> Iterator[np.ndarray]:
        yield np.full(len(text.split()) * RATE // 10, 0.1, np.float32)


@dataclass
class RecordingSink:
    """A speaker that plays at once; ``heard_samples`` caps what the user heard (an interruption).

    ``queued``: what :meth:`queued_ms` says is left to play (``None``: not real time, as a file).
    """

    heard_samples: int | None = None
    queued: float | None = None
    lose_on_play: int | None = None  # the device is lost at this play call
    played: list[tuple[int, int]] = field(default_factory=list)  # (turn, samples)
    first_audio_t_ns: dict[int, int] = field(default_factory=dict)
    played_samples: dict[int, int] = field(default_factory=dict)
    losses: int = 0
    stopped: int = 0

    def play(self, turn_id: int, audio: np.ndarray) -> None:
        if self.lose_on_play is not None and len(self.played) == self.lose_on_play:
            raise DeviceLostError("the output device 'spk' stopped working")
        self.played.append((turn_id, audio.size))
        self.first_audio_t_ns.setdefault(turn_id, time.monotonic_ns())
        total = self.played_samples.get(turn_id, 0) + audio.size
        self.played_samples[turn_id] = (
            min(total, self.heard_samples) if self.heard_samples is not None else total
        )

    def stop(self) -> None:
        self.stopped += 1

    def queued_ms(self) -> float | None:
        return self.queued

    def wait(self, timeout_s: float | None = None) -> bool:
        return True


def make(
    asr: ScriptedAsr, reply: str = "Seven days. That is a week.", **decoder
) -> tuple[VoicePipeline, list[Event]]:
    events: list[Event] = []
    dialogue = Dialogue(ScriptedDecoder(reply, **decoder), WordTokenizer(), "Be brief.", GenerationOptions())
    pipeline = VoicePipeline(
        dialogue,
        asr,
        ScriptedVoice(),
        lambda: SentenceSplitter(SplitterOptions()),
        PipelineOptions(),
        events.append,
    )
    return pipeline, events


def speech(turn: int, seconds: float, cut: bool = False) -> SpeechEnded:
    now = time.monotonic_ns()
    return SpeechEnded(turn, now, now - 200_000_000, np.full(int(seconds * RATE), 0.2, np.float32), cut=cut)


def kinds(events: list[Event], turn: int | None = None) -> list[str]:
    return [type(e).__name__ for e in events if turn is None or e.turn_id == turn]


def test_a_turn_runs_every_stage_in_order_and_leaves_one_exchange_in_the_history():
    pipeline, events = make(ScriptedAsr(["How many days are in a week?"]))
    sink = RecordingSink()
    record = pipeline.run_turn(speech(1, 2.0), sink, threading.Event())
    assert record is not None and record.transcript == "How many days are in a week?"
    assert record.reply == "Seven days. That is a week." and not record.cancelled
    order = kinds(events)
    for earlier, later in [
        ("TranscriptReady", "PromptSubmitted"),
        ("PromptSubmitted", "TokenGenerated"),
        ("SentenceReady", "AudioReady"),
        ("AudioReady", "AudioStarted"),
        ("PlaybackEnded", "TurnDone"),
    ]:
        assert order.index(earlier) < order.index(later), order
    assert [t for t, _ in sink.played] == [1, 1]  # a piece per sentence, played in order
    (turn,) = pipeline.dialogue.turns
    assert turn.user == "How many days are in a week?" and turn.assistant == record.reply


RUN_ON_REPLY = (
    "Paris grew from a small fishing village on an island in the river into a great city of "
    "kings and artists and builders over two thousand years."
)


@pytest.mark.parametrize(("queued", "pieces"), [(0.0, "several"), (None, 2)], ids=["speaker", "file"])
def test_a_run_on_reply_goes_to_the_voice_in_words_when_the_speaker_is_about_to_run_dry(queued, pieces):
    """Once what is left to play falls under ``refill_ms`` and nothing is rendering, the words so
    far are spoken rather than a silence until the sentence ends (a 3.9 s one before); a file
    (no real time) gets the first chunk and then the sentence whole, as before.

    The scripted decoder generates each word only once every piece said so far was played.
    """
    sink = RecordingSink(queued=queued)
    seen: list[Event] = []

    def voice_caught_up() -> None:
        deadline = time.monotonic() + 5
        while len(sink.played) < kinds(seen).count("SentenceReady") and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.002)  # the TTS thread counts the piece as rendered just after playing it

    asr = ScriptedAsr(["Tell me about Paris."])
    pipeline, events = make(asr, reply=RUN_ON_REPLY, before_word=voice_caught_up)
    seen = events
    record = pipeline.run_turn(speech(1, 1.0), sink, threading.Event())
    assert record is not None and record.reply == RUN_ON_REPLY
    said = [e.text for e in events if isinstance(e, SentenceReady)]
    assert " ".join(said) == RUN_ON_REPLY and len(sink.played) == len(said)  # every word spoken, in order
    if pieces == "several":
        assert len(said) >= 5 and all(len(s.split()) >= 3 for s in said[1:-1]), said
    else:
        assert len(said) == pieces, said


def test_audio_started_is_told_once_as_soon_as_the_first_sample_played_not_after_the_reply():
    """The live breakdown showed "voice-to-voice running 12.3 s" while the reply had been
    audible since 0.6 s: ``AudioStarted`` came only once the whole reply had played."""
    pipeline, events = make(ScriptedAsr(["Tell me about weeks."]), reply="A week has seven days. " * 6)
    sink = RecordingSink()  # plays each piece at once
    pipeline.run_turn(speech(1, 1.0), sink, threading.Event())
    order = kinds(events, 1)
    assert order.count("AudioStarted") == 1 and order.count("AudioReady") > 2
    last_piece = len(order) - 1 - order[::-1].index("AudioReady")
    assert order.index("AudioStarted") < last_piece
    (started,) = [e for e in events if isinstance(e, AudioStarted)]
    assert started.t_ns == sink.first_audio_t_ns[1]


def test_a_speculative_turn_plays_nothing_until_confirmed():
    pipeline, events = make(ScriptedAsr(["How many days are in a week?"]))
    sink, gate, result = RecordingSink(), ReplyGate(confirmed=False), []
    thread = threading.Thread(
        target=lambda: result.append(pipeline.run_turn(speech(1, 2.0), sink, threading.Event(), gate)),
        daemon=True,  # a failed assertion must not leave the test run waiting for it
    )
    thread.start()
    deadline = time.monotonic() + 5
    while "SentenceReady" not in kinds(events) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert "SentenceReady" in kinds(events) and not sink.played and not pipeline.dialogue.turns
    assert kinds(events).count("SentenceReady") == 1  # held after its first chunk
    gate.confirm()
    thread.join(5)
    assert result[0] is not None and sink.played and len(pipeline.dialogue.turns) == 1


def test_a_discarded_speculation_leaves_no_record_no_audio_and_no_history():
    pipeline, events = make(ScriptedAsr(["I would like to know"]))
    sink, gate, result = RecordingSink(), ReplyGate(confirmed=False), []
    cancel = threading.Event()
    thread = threading.Thread(
        target=lambda: result.append(pipeline.run_turn(speech(1, 1.0), sink, cancel, gate)),
        daemon=True,  # a failed assertion must not leave the test run waiting for it
    )
    thread.start()
    deadline = time.monotonic() + 5
    while "SentenceReady" not in kinds(events) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not sink.played  # speculative: held before playing
    gate.discard("speech resumed")
    cancel.set()
    thread.join(5)
    assert result == [None] and not sink.played and not pipeline.dialogue.turns and not pipeline.records
    (discarded,) = [e for e in events if isinstance(e, SpeculationDiscarded)]
    assert discarded.reason == "speech resumed" and discarded.work_ms > 0
    assert "TurnDone" not in kinds(events)


def test_speech_cut_for_length_is_held_then_answered_with_the_rest_as_one_question():
    asr = ScriptedAsr(["the first part and the rest"])
    pipeline, events = make(asr)
    sink = RecordingSink()
    assert pipeline.run_turn(speech(1, 20.0, cut=True), sink, threading.Event()) is None
    (held,) = [e for e in events if isinstance(e, TurnHeld)]
    assert (
        held.turn_id == 1 and held.pending_ms == pytest.approx(20_000) and not asr.heard
    )  # under a window: not yet
    record = pipeline.run_turn(speech(2, 3.0), sink, threading.Event())
    assert asr.heard == [(23 * RATE, False, True)]  # both parts in one transcription, long-form
    (ready,) = [e for e in events if isinstance(e, TranscriptReady)]
    assert (
        ready.held_turns == (1,) and record is not None and record.transcript == "the first part and the rest"
    )
    assert [t for t, _ in sink.played] == [2, 2] and len(pipeline.dialogue.turns) == 1


def test_held_speech_past_a_window_is_transcribed_while_the_user_still_speaks():
    asr = ScriptedAsr(["clip one", "clip two"])
    pipeline, events = make(asr)
    pipeline.run_turn(speech(1, 20.0, cut=True), RecordingSink(), threading.Event())
    pipeline.run_turn(speech(2, 20.0, cut=True), RecordingSink(), threading.Event())
    assert len(asr.heard) == 1 and asr.heard[0][0] <= WINDOW_S * RATE  # the first clip, final now
    held = [e for e in events if isinstance(e, TurnHeld)]
    assert held[-1].text == "clip one" and held[-1].pending_ms < 20_000
    assert pipeline.hearing.drop_held() == [1, 2] and pipeline.hearing.drop_held() == []


def test_an_interrupted_reply_keeps_only_the_words_that_were_played():
    pipeline, events = make(
        ScriptedAsr(["How many days are in a week?"]), reply="Seven days make one whole week."
    )
    sink = RecordingSink(heard_samples=3 * RATE // 10)  # three words' worth of audio
    cancel = threading.Event()

    original_play = sink.play

    def play(turn_id: int, audio: np.ndarray) -> None:
        original_play(turn_id, audio)
        cancel.set()  # the user barged in while the first piece played

    sink.play = play  # type: ignore[method-assign]
    record = pipeline.run_turn(speech(1, 2.0), sink, cancel)
    (cancelled,) = [e for e in events if isinstance(e, TurnCancelled)]
    assert cancelled.reason == "interrupted" and cancelled.heard_text == "Seven days make"
    assert pipeline.dialogue.turns[-1].assistant == "Seven days make" and sink.stopped
    assert record is not None and record.cancelled == "interrupted"


def test_no_words_recognised_cancels_the_turn_without_asking_the_llm():
    pipeline, events = make(ScriptedAsr([""]))
    record = pipeline.run_turn(speech(1, 1.0), RecordingSink(), threading.Event())
    assert record is not None and record.cancelled == "no words recognised"
    assert not pipeline.dialogue.decoder.prompts and "TurnDone" in kinds(events)


def test_a_lost_llm_server_keeps_the_text_so_far_and_says_so():
    pipeline, events = make(
        ScriptedAsr(["Tell me about weeks."]), reply="A week has seven days.", fail_after=3
    )
    record = pipeline.run_turn(speech(1, 2.0), RecordingSink(), threading.Event())
    (cancelled,) = [e for e in events if isinstance(e, TurnCancelled)]
    assert cancelled.reason == CancelReason.LLM_SERVER_LOST and cancelled.heard_text == "A week has"
    assert record is not None and record.reply == "A week has"


def test_a_lost_speaker_cuts_the_audio_but_keeps_the_reply_text():
    pipeline, events = make(ScriptedAsr(["How many days are in a week?"]))
    sink = RecordingSink(lose_on_play=1)  # the second sentence finds the device gone
    record = pipeline.run_turn(speech(1, 2.0), sink, threading.Event())
    (cancelled,) = [e for e in events if isinstance(e, TurnCancelled)]
    assert (
        cancelled.reason == CancelReason.SPEAKER_LOST
        and cancelled.heard_text == "Seven days. That is a week."
    )
    assert len(sink.played) == 1 and sink.stopped and record is not None
    assert any(isinstance(e, AudioStarted) for e in events)


def test_a_partial_transcript_is_skipped_while_the_turn_transcribes_and_dropped_once_stale():
    asr = ScriptedAsr(["how many", "how many days"])
    pipeline, events = make(asr)
    pipeline.hearing.partial_transcript(1, np.zeros(RATE, np.float32))
    assert [e.text for e in events if isinstance(e, PartialTranscript)] == ["how many"]
    with pipeline.hearing.lock:  # the turn's own ASR holds the model
        pipeline.hearing.partial_transcript(1, np.zeros(RATE, np.float32))
    assert len(asr.heard) == 1
    pipeline.hearing.started(1)  # the turn's own ASR began: a partial finishing now is stale
    pipeline.hearing.partial_transcript(1, np.zeros(RATE, np.float32))
    assert len([e for e in events if isinstance(e, PartialTranscript)]) == 1


def test_a_typed_turn_has_no_speech_stages_and_is_spoken_when_a_sink_is_given():
    pipeline, events = make(ScriptedAsr(["unused"]))
    sink = RecordingSink()
    record = pipeline.run_text_turn(1, "  hello there ", sink, threading.Event())
    assert record.transcript == "hello there" and sink.played
    assert record.metrics["asr_ms"] is None and record.metrics["voice_to_voice_ms"] is None
    assert any(isinstance(e, TurnDone) for e in events) and "SpeechPaused" not in kinds(events)


class DoubtfulTranscriber:
    """Returns what Whisper's checks left out of a decode (the text itself is empty)."""

    description = "doubtful"

    def __init__(self, left_out: str) -> None:
        self.left_out = left_out

    def transcribe(self, audio, quick=False, long_form=False, partial=False) -> TranscriptResult:
        return TranscriptResult("", 1000.0, 5.0, "en", 0.1, left_out=self.left_out)

    def phrase_logprobs(self, audio, phrases):
        raise AssertionError("a stop request or no words: nothing to score")


@pytest.mark.parametrize(("left_out", "heard"), [("the top.", "the top."), ("We have to go.", ""), ("", "")])
def test_speech_over_a_reply_that_failed_whispers_checks_still_stops_it_when_it_asks_to(left_out, heard):
    """On the echo rig "Please stop." came out as a doubtful " the top." (left out): the reply played on."""
    from assistant.turns.hearing import Hearing

    hearing = Hearing(DoubtfulTranscriber(left_out), lambda _event: None)
    assert hearing.transcribe_overlap(np.zeros(RATE, np.float32)).text == heard


class MishearingTranscriber:
    """Writes ``text`` and scores phrases as ``scores`` says (-8 for any other); counts the scorings."""

    description = "mishearing"

    def __init__(self, text: str, scores: dict[str, float], no_speech: float = 0.1) -> None:
        self.text, self.scores, self.no_speech = text, scores, no_speech
        self.scored: list[list[str]] = []

    def transcribe(self, audio, quick=False, long_form=False, partial=False) -> TranscriptResult:
        return TranscriptResult(self.text, 1000.0, 5.0, "en", self.no_speech)

    def phrase_logprobs(self, audio, phrases):
        self.scored.append(list(phrases))
        return [self.scores.get(p, -8.0) for p in phrases]


@pytest.mark.parametrize(
    ("text", "scores", "heard"),
    [
        ("Please come.", {"Please come.": -0.5, "Please stop.": -0.9}, "Please stop."),
        ("Please come here.", {"Please come here.": -0.4, "Please stop.": -3.8}, "Please come here."),
        ("What about Rome?", {"What about Rome?": -0.3}, "What about Rome?"),
    ],
)
def test_a_few_words_over_a_reply_that_score_as_a_stop_request_are_one(text, scores, heard):
    """On the echo rig "Please stop." was heard as "Please come." and the reply was answered, not stopped."""
    from assistant.turns.hearing import Hearing

    asr = MishearingTranscriber(text, scores)
    assert Hearing(asr, lambda _event: None).transcribe_overlap(np.zeros(RATE, np.float32)).text == heard
    assert asr.scored and asr.scored[0][0] == text


@pytest.mark.parametrize(
    ("text", "no_speech"),
    [("Stop.", 0.1), ("Yeah.", 0.1), ("Stop. What is the capital of Germany?", 0.1), ("Please come.", 0.95)],
)
def test_stop_requests_backchannels_long_words_and_doubtful_speech_are_not_scored(text, no_speech):
    from assistant.turns.hearing import Hearing

    asr = MishearingTranscriber(text, {}, no_speech)
    Hearing(asr, lambda _event: None).transcribe_overlap(np.zeros(RATE, np.float32))
    assert asr.scored == []


def test_speech_in_the_window_is_transcribed_once_joined_to_the_question_and_judged_by_its_rest():
    """The rest of a question alone read 16.5 % WER against 10.7 % joined (bench.asr_halves)."""
    from assistant.turns.hearing import CONTINUATION_GAP_SAMPLES, Hearing
    from assistant.turns.protocols import Said

    asr = ScriptedAsr(["I would like to know how many days are in a week?", "Tell me about Paris. Mm-hmm."])
    hearing = Hearing(asr, lambda _event: None)
    question = Said(np.zeros(RATE, np.float32), "I would like to know")
    overheard = hearing.transcribe_overlap(np.zeros(RATE, np.float32), question)
    assert overheard.text == "how many days are in a week?"
    assert overheard.joined is not None and overheard.joined.text.startswith("I would like to know how")
    assert asr.heard == [(2 * RATE + CONTINUATION_GAP_SAMPLES, False, False)]  # one pass, the turn's beam
    backchannel = hearing.transcribe_overlap(
        np.zeros(RATE, np.float32), Said(question.audio, "Tell me about Paris.")
    )
    assert backchannel.text == "Mm-hmm."


class ViewAsr(ScriptedAsr):
    """Hears ``texts[0]`` in the joined pass over zeros (the gated view), ``texts[1]`` over the rest."""

    def transcribe(self, audio, quick=False, long_form=False, partial=False) -> TranscriptResult:
        self.heard.append((audio.size, quick, long_form))
        text = self.texts[0] if not audio.any() else self.texts[1]
        return TranscriptResult(text, 1000 * audio.size / RATE, 5.0, "en", 0.0)


@pytest.mark.parametrize(
    ("gated", "raw_passes"),
    [("I would like to know. Any days are in a week.", 1), ("Tell me about Paris. Mm-hmm.", 0)],
)
def test_words_in_the_window_while_the_canceller_settles_are_transcribed_for_the_turn_as_the_mic_heard_them(
    gated, raw_passes
):
    """At a session's first reply AEC3's suppressor took "how many" of the rest ("Any days are in a week.").

    The words are judged as they were (the gated view); the turn's transcript is the question
    joined to the microphone as it heard them. A backchannel needs no second pass.
    """
    from assistant.turns.hearing import Hearing
    from assistant.turns.protocols import Said

    question, rest = gated.split(". ", 1)[0], "I would like to know how many days are in a week."
    asr = ViewAsr([gated, rest])
    raw = np.ones(RATE, np.float32)
    overheard = Hearing(asr, lambda _event: None).transcribe_overlap(
        np.zeros(RATE, np.float32), Said(np.zeros(RATE, np.float32), question), raw=raw
    )
    assert overheard.text == gated.split(". ", 1)[1]  # judged on the gated view, as before
    assert overheard.joined is not None
    assert overheard.joined.text == (rest if raw_passes else gated)
    assert len(asr.heard) == 1 + raw_passes


def test_a_continued_question_judged_joined_needs_no_asr_pass_of_its_own():
    from assistant.turns.hearing import CONTINUATION_GAP_SAMPLES, Hearing

    asr = ScriptedAsr(["I would like to know how many days are in a week?"])
    hearing = Hearing(asr, lambda _event: None)
    hearing.continue_with(1, np.zeros(RATE, np.float32))
    whole = TranscriptResult("I would like to know how many days are in a week?", 2300.0, 150.0, "en", 0.0)
    result, text, held, audio = hearing.transcribe(np.zeros(RATE, np.float32), whole)
    assert (result, text) == (whole, "I would like to know how many days are in a week?")
    assert asr.heard == [] and held.turns == [1] and audio.size == 2 * RATE + CONTINUATION_GAP_SAMPLES
    hearing.transcribe(np.zeros(RATE, np.float32))  # without it: one joined pass, as before
    assert asr.heard == [(2 * RATE + CONTINUATION_GAP_SAMPLES, False, False)]


def test_a_joined_transcript_never_stands_for_speech_that_is_not_a_held_question():
    from assistant.turns.hearing import Hearing

    asr = ScriptedAsr(["the held rest and the end"])
    hearing = Hearing(asr, lambda _event: None)
    hearing.hold(1, np.zeros(RATE, np.float32))  # cut for length: its audio is not transcribed yet
    _, text, _, _ = hearing.transcribe(np.zeros(RATE, np.float32), TranscriptResult("x", 1.0, 1.0, "en", 0.0))
    assert text == "the held rest and the end" and asr.heard == [(2 * RATE, False, True)]


def test_the_rest_of_a_joined_pass_is_not_scored_against_stop_phrases():
    """A bench run took "who wrote" (the rest up to a pause) for "Hold on." and dropped the question."""
    from assistant.turns.hearing import Hearing
    from assistant.turns.protocols import Said

    asr = MishearingTranscriber("Do you know who wrote", {"who wrote": -2.5, "Hold on.": -4.0})
    overheard = Hearing(asr, lambda _event: None).transcribe_overlap(
        np.zeros(RATE, np.float32), Said(np.zeros(RATE, np.float32), "Do you know?")
    )
    assert overheard.text == "who wrote" and asr.scored == []


def test_a_spoken_turn_that_waited_for_a_typed_one_shows_the_wait_apart_from_asr():
    """Speech that ended while a typed question was answered waits for it (one turn at a time).

    A UI check: the breakdown put that wait (3.5 s) into the spoken turn's ASR bar. The wait
    is ``queued_ms``; ASR counts from when the turn could start.
    """
    pipeline, events = make(ScriptedAsr(["How many days are in a week?"]))
    pipeline.dialogue.decoder.before_word = lambda: time.sleep(0.05)  # the typed reply takes a while
    runs = TurnRuns(pipeline, lambda: RecordingSink(), lambda _attempt: True, lambda _attempt: None)
    runs.start(Start(1, 1, "Name a colour.", confirmed=True))
    runs.start(Start(2, 2, speech(2, 1.0), confirmed=True))
    for thread in runs.threads():
        thread.join(10)
    typed_done, spoken = (e for e in events if isinstance(e, TurnDone))
    ready = next(e for e in events if isinstance(e, TranscriptReady) and e.turn_id == 2)
    record, endpoint = spoken.record, spoken.record.timestamps_ns["endpoint"]
    assert typed_done.t_ns > endpoint  # it waited for the typed turn
    assert record.metrics["asr_ms"] <= (ready.t_ns - typed_done.t_ns) / 1e6, record.metrics  # not in ASR
    assert ready.queued_until_t_ns >= typed_done.t_ns
    assert record.metrics["queued_ms"] == (ready.queued_until_t_ns - endpoint) / 1e6
    assert record.metrics["asr_ms"] == (ready.t_ns - ready.queued_until_t_ns) / 1e6
    alone, _ = make(ScriptedAsr(["How many days are in a week?"]))
    assert alone.run_turn(speech(3, 1.0), RecordingSink(), threading.Event()).metrics["queued_ms"] == 0

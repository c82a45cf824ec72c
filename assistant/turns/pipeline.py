"""The voice loop: the only module that knows every stage.

utterance (VAD) -> ASR -> decoder token stream -> sentence splitter -> TTS -> output,
with a typed, timestamped event for every step (``assistant.events``) and a latency record
per turn (``assistant.observe.latency``). TTS runs on its own thread, so the first sentence is
spoken while the rest of the reply is still being generated.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from assistant.events import (
    CancelReason,
    DiscardReason,
    EchoMeasured,
    Event,
    PlaybackEnded,
    SpeculationDiscarded,
    SpeculationStarted,
    SpeechEnded,
    SpeechPaused,
    TranscriptReady,
    TurnCancelled,
)
from assistant.observe.latency import TurnRecord
from assistant.stages.asr import TranscriptResult
from assistant.stages.audio import AudioSink
from assistant.stages.dialogue import Dialogue, Reply
from assistant.turns.hearing import Hearing
from assistant.turns.protocols import PipelineOptions, ReplyGate, Said, Splits, Synthesizes, Transcribes
from assistant.turns.reply_stream import stream_reply
from assistant.turns.speaking import ReplyAudio
from assistant.turns.turn_log import TurnLog
from engines.serving.remote import ServerUnavailable

logger = logging.getLogger(__name__)


class VoicePipeline:
    """Runs turns through every stage and reports events to ``emit`` (from worker threads).

    Its parts: :class:`Hearing` (ASR and held speech), :func:`stream_reply` (tokens to
    sentences), :class:`ReplyAudio` (TTS and playback) and :class:`TurnLog` (events, records).
    """

    def __init__(
        self,
        dialogue: Dialogue,
        transcriber: Transcribes,
        synthesizer: Synthesizes | None,
        make_splitter: Callable[[], Splits],
        options: PipelineOptions,
        emit: Callable[[Event], None] | None = None,
        llm_model: str = "",
    ) -> None:
        self.dialogue = dialogue
        self.transcriber = transcriber
        self.synthesizer = synthesizer
        self.make_splitter = make_splitter
        self.options = options
        self.llm_model = llm_model
        self.log = TurnLog(emit, options.log_path)
        self.records = self.log.records
        self.emit = self.log.emit
        self.hearing = Hearing(transcriber, self.emit)
        self._server_lost: set[int] = set()  # turns whose LLM server failed mid-reply
        # (ERLE dB, echo delay ms) over the reply just played, when the microphone is echo-cancelled
        self.echo_report: Callable[[], tuple[float | None, float | None]] | None = None
        # The transcript of a pause's speculative run: the end-of-turn policy may end on it.
        self.pause_transcribed: Callable[[SpeechPaused, str], None] | None = None

    def run_turn(
        self,
        utterance: SpeechEnded | SpeechPaused,
        sink: AudioSink | None,
        cancel: threading.Event,
        gate: ReplyGate | None = None,
        heard: TranscriptResult | None = None,
        queued_until_ns: int = 0,
    ) -> TurnRecord | None:
        """Answer one utterance; returns its record once the reply has played (or was cut).

        ``heard``: the words of the held question and the utterance, transcribed already (the
        rest of a question, judged joined to it over the reply): no ASR pass runs for it
        (:meth:`Hearing.transcribe`). ``queued_until_ns``: when the turns before it were done,
        if it waited for them (0: it did not).

        With an unconfirmed ``gate`` (speculation from a ``SpeechPaused``) the work starts at
        once but waits for the gate before playing or recording anything; a discarded gate
        returns ``None`` and leaves no record (the user's turn goes on). An utterance cut for
        length is only held (``TurnHeld``, returns ``None``, no record); the next turn that is
        answered answers the held speech and its own together, as one question.
        """
        gate = gate or ReplyGate()
        turn = utterance.turn_id
        start_ns = time.monotonic_ns()
        self.log.forget_before(turn)
        if not self.log.emitted(utterance):
            self.emit(utterance)
        if not gate.confirmed.is_set():
            self.emit(SpeculationStarted(turn, start_ns, "asr"))
        hearing = self.hearing
        hearing.started(turn)
        if isinstance(utterance, SpeechEnded) and utterance.cut:
            hearing.hold(turn, utterance.audio)
            return None
        result, text, held, audio = hearing.transcribe(utterance.audio, heard)
        gate.said = Said(audio, text)
        if gate.discarded:
            self._discarded(turn, start_ns, gate.reason)
            return None
        if isinstance(utterance, SpeechPaused) and self.pause_transcribed is not None:
            self.pause_transcribed(utterance, text)
        self.emit(
            TranscriptReady(
                turn, time.monotonic_ns(), text, result.asr_ms, tuple(held.turns), result.window,
                result.fell_back, result.unclear, queued_until_ns,
            )
        )  # fmt: skip
        if not text:
            if not gate.wait(cancel):
                self._discarded(turn, start_ns, gate.reason)
                return None
            self.emit(TurnCancelled(turn, time.monotonic_ns(), CancelReason.NO_WORDS))
            record: TurnRecord | None = self._finish(turn)
        else:
            record = self._answer(turn, text, sink, cancel, gate, start_ns)
        if record is not None:
            hearing.answered(held)
        if gate.joins_next and gate.hold_speech:  # the user went on: answer it all next turn
            hearing.continue_with(turn, audio)
        return record

    def run_text_turn(
        self,
        turn: int,
        text: str,
        sink: AudioSink | None,
        cancel: threading.Event,
        gate: ReplyGate | None = None,
    ) -> TurnRecord:
        """Answer a typed message: spoken too when ``sink`` is given.

        Its record has no speech stages (endpointing, ASR, voice-to-voice are ``None``);
        the ``TranscriptReady`` it emits carries the typed text.
        """
        self.log.forget_before(turn)
        self.emit(TranscriptReady(turn, time.monotonic_ns(), text.strip(), 0.0))
        # The live loop's gate asks the turn engine before each piece plays: a typed turn's reply
        # holds the floor like a spoken one's (the microphone is gated or heard over it alike).
        record = self._answer(turn, text.strip(), sink, cancel, gate or ReplyGate(), time.monotonic_ns())
        assert record is not None  # a confirmed gate is never discarded
        return record

    def _answer(
        self,
        turn: int,
        text: str,
        sink: AudioSink | None,
        cancel: threading.Event,
        gate: ReplyGate,
        start_ns: int,
    ) -> TurnRecord | None:
        audio = None
        if sink is not None and self.synthesizer is not None:  # else text only: nothing to speak with
            audio = ReplyAudio(turn, self.synthesizer, sink, cancel, gate, self.emit)
            audio.start()
        try:
            reply = self._generate(turn, text, audio, cancel, gate)
        finally:
            if audio is not None:
                audio.close()
        if not gate.wait(cancel):
            reply.discard()
            self._discarded(turn, start_ns, gate.reason)
            return None
        reply.confirm()  # now the exchange is part of the conversation
        lost = audio.finish_playing() if audio is not None else ""
        self.emit(PlaybackEnded(turn, time.monotonic_ns()))
        if turn in self._server_lost and not cancel.is_set():
            self.emit(
                TurnCancelled(turn, time.monotonic_ns(), CancelReason.LLM_SERVER_LOST, self.dialogue_reply())
            )
        elif lost and not cancel.is_set():
            # The speaker went away: the reply is cut, but its text stays in the conversation
            # and the record (it was shown; the user can read it or ask again).
            logger.info("turn %d: playback given up: %s", turn, lost)
            self.emit(
                TurnCancelled(turn, time.monotonic_ns(), CancelReason.SPEAKER_LOST, self.dialogue_reply())
            )
        elif cancel.is_set() and gate.joins_next:
            heard = audio.heard() if audio is not None else ""
            self.dialogue.forget_last_exchange()  # the question goes on; it is answered whole next
            self.emit(TurnCancelled(turn, time.monotonic_ns(), CancelReason.CONTINUED, heard))
        elif cancel.is_set():
            heard = audio.heard() if audio is not None else self.dialogue_reply()
            self.dialogue.revise_last_reply(heard)
            self.emit(TurnCancelled(turn, time.monotonic_ns(), CancelReason.INTERRUPTED, heard))
        if self.echo_report is not None and audio is not None:
            erle_db, delay_ms = self.echo_report()
            self.emit(EchoMeasured(turn, time.monotonic_ns(), erle_db, delay_ms))
        return self._finish(turn)

    def _discarded(self, turn: int, start_ns: int, reason: DiscardReason) -> None:
        self.hearing.finished(turn)  # the user goes on: partial transcripts again
        work_ms = (time.monotonic_ns() - start_ns) / 1e6
        self.emit(SpeculationDiscarded(turn, time.monotonic_ns(), reason, work_ms))

    def dialogue_reply(self) -> str:
        """The last reply as generated (what a reader saw when nothing is spoken)."""
        return self.dialogue.turns[-1].assistant if self.dialogue.turns else ""

    def _generate(
        self,
        turn: int,
        text: str,
        audio: ReplyAudio | None,
        cancel: threading.Event,
        gate: ReplyGate,
    ) -> Reply:
        """Stream the reply's sentences to ``audio`` (if any); unconfirmed, it pauses after the first one."""
        if not gate.confirmed.is_set():
            self.emit(SpeculationStarted(turn, time.monotonic_ns(), "llm"))
        reply = self.dialogue.ask(text, cancel, held=True)
        try:
            say, left = (audio.say, audio.left_to_play_ms) if audio is not None else (_silent, _unknown)
            stream_reply(turn, reply, self.make_splitter(), say, cancel, gate, self.emit, left)
        except ServerUnavailable as e:  # --llm-server: the text so far is kept, the next turn reconnects
            logger.warning("turn %d: %s", turn, e)
            self._server_lost.add(turn)
        return reply

    def _finish(self, turn: int) -> TurnRecord:
        self.hearing.finished(turn)
        self._server_lost.discard(turn)
        return self.log.finish(
            turn,
            backend=self.dialogue.decoder.name,
            backend_fallback=self.dialogue.decoder.fallback,
            llm_model=self.llm_model,
            asr_model=self.transcriber.description,
            tts_voice=self.synthesizer.description if self.synthesizer is not None else "",
        )


def _silent(_index: int, _sentence: str) -> None:
    """Where sentences go when nothing speaks (text only)."""


def _unknown() -> None:
    """How much is left to play when nothing speaks: not known."""

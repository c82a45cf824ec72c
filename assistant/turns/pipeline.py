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

import numpy as np

from assistant.events import (
    CancelReason,
    DiscardReason,
    EchoMeasured,
    Event,
    PartialTranscript,
    PlaybackEnded,
    PromptSubmitted,
    SentenceReady,
    SpeculationDiscarded,
    SpeculationStarted,
    SpeechEnded,
    SpeechPaused,
    TokenGenerated,
    TranscriptReady,
    TurnCancelled,
    TurnDone,
    TurnHeld,
)
from assistant.observe.latency import TurnRecord, build_record
from assistant.stages.asr import first_clip_end
from assistant.stages.audio import AudioSink
from assistant.stages.dialogue import Dialogue, Reply
from assistant.stages.vad import SAMPLE_RATE_HZ
from assistant.turns.protocols import (
    HeldSpeech,
    PipelineOptions,
    ReplyGate,
    Splits,
    Synthesizes,
    Transcribes,
)
from assistant.turns.speaking import ReplyAudio
from engines.serving.remote import ServerUnavailable
from store.files import append_line

logger = logging.getLogger(__name__)

CONTINUATION_GAP_SAMPLES = SAMPLE_RATE_HZ * 3 // 10  # 0.3 s between a question and its rest
OVERLAP_NO_SPEECH = 0.8  # Whisper's no-speech probability above which speech over a reply had no words


class VoicePipeline:
    """Runs turns through every stage and reports events to ``emit`` (from worker threads)."""

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
        self._emit_external = emit
        self.llm_model = llm_model
        self.records: list[TurnRecord] = []
        self._events: list[Event] = []  # the turns in flight; emitted from several threads
        self._events_lock = threading.Lock()
        self.asr_lock = threading.Lock()  # one transcription at a time: the turn's, or a partial one
        self._transcribing: set[int] = set()  # turns whose own ASR has started
        self._server_lost: set[int] = set()  # turns whose LLM server failed mid-reply
        self.held = HeldSpeech()  # only the turn threads touch it, one turn at a time
        # (ERLE dB, echo delay ms) over the reply just played, when the microphone is echo-cancelled
        self.echo_report: Callable[[], tuple[float | None, float | None]] | None = None

    def emit(self, event: Event) -> None:
        """Record an event and pass it on."""
        with self._events_lock:
            self._events.append(event)
        if self._emit_external:
            self._emit_external(event)

    def run_turn(
        self,
        utterance: SpeechEnded | SpeechPaused,
        sink: AudioSink | None,
        cancel: threading.Event,
        gate: ReplyGate | None = None,
    ) -> TurnRecord | None:
        """Answer one utterance; returns its record once the reply has played (or was cut).

        With an unconfirmed ``gate`` (speculation from a ``SpeechPaused``) the work starts at
        once but waits for the gate before playing or recording anything; a discarded gate
        returns ``None`` and leaves no record (the user's turn goes on). An utterance cut for
        length is only held (``TurnHeld``, returns ``None``, no record); the next turn that is
        answered answers the held speech and its own together, as one question.
        """
        gate = gate or ReplyGate()
        turn = utterance.turn_id
        start_ns = time.monotonic_ns()
        self._forget_other_turns(turn)
        with self._events_lock:
            seen = any(e is utterance for e in self._events)
        if not seen:
            self.emit(utterance)
        if not gate.confirmed.is_set():
            self.emit(SpeculationStarted(turn, start_ns, "asr"))
        self._transcribing.add(turn)  # a partial transcript finishing now would be stale
        if isinstance(utterance, SpeechEnded) and utterance.cut:
            self._hold(turn, utterance.audio)
            return None
        held = self.held
        audio = np.concatenate([held.audio, utterance.audio]) if held.turns else utterance.audio
        with self.asr_lock:
            result = self.transcriber.transcribe(audio, long_form=bool(held.turns) and not held.continued)
        text = " ".join([*held.texts, result.text.strip()]).strip()
        if gate.discarded:
            self._discarded(turn, start_ns, gate.reason)
            return None
        asr_ms = result.asr_ms
        self.emit(
            TranscriptReady(
                turn,
                time.monotonic_ns(),
                text,
                asr_ms,
                tuple(held.turns),
                result.window,
                result.fell_back,
                result.unclear,
            )
        )
        if not text:
            if not gate.wait(cancel):
                self._discarded(turn, start_ns, gate.reason)
                return None
            self.emit(TurnCancelled(turn, time.monotonic_ns(), CancelReason.NO_WORDS))
            record: TurnRecord | None = self._finish(turn)
        else:
            record = self._answer(turn, text, sink, cancel, gate, start_ns)
        if record is not None and self.held is held:
            self.held = HeldSpeech()  # answered: the next long utterance starts afresh
        if gate.joins_next and gate.hold_speech:  # the user went on: answer it all next turn
            gap = np.zeros(CONTINUATION_GAP_SAMPLES, np.float32)
            self.held = HeldSpeech([turn], [], np.concatenate([audio, gap]), continued=True)
        return record

    def drop_held(self) -> list[int]:
        """Forget the held speech (the microphone was lost mid-utterance); returns its turns."""
        held, self.held = self.held, HeldSpeech()
        return held.turns

    def _hold(self, turn: int, audio: np.ndarray) -> None:
        """Keep a turn cut for length; transcribe the held speech's clips that became final."""
        held = self.held
        held.turns.append(turn)
        held.audio = np.concatenate([held.audio, audio])
        while (end := first_clip_end(held.audio)) is not None:
            with self.asr_lock:
                result = self.transcriber.transcribe(held.audio[:end], long_form=True)
            if text := result.text.strip():
                held.texts.append(text)
            held.audio = held.audio[end:]
        self._transcribing.discard(turn)
        pending_ms = 1000.0 * held.audio.size / SAMPLE_RATE_HZ
        self.emit(TurnHeld(turn, time.monotonic_ns(), " ".join(held.texts), pending_ms))

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
        self._forget_other_turns(turn)
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
            reply = self._generate(turn, text, audio.say if audio is not None else _silent, cancel, gate)
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
        self._transcribing.discard(turn)  # the user goes on: partial transcripts again
        work_ms = (time.monotonic_ns() - start_ns) / 1e6
        self.emit(SpeculationDiscarded(turn, time.monotonic_ns(), reason, work_ms))

    def partial_transcript(self, turn: int, audio: np.ndarray) -> None:
        """Transcribe the utterance in progress for the live display (``PartialTranscript``).

        Skipped when the turn's own ASR holds the model: the final answer never waits for it
        to start (at most for one partial already running).
        """
        if not self.asr_lock.acquire(blocking=False):
            return
        try:
            result = self.transcriber.transcribe(audio, quick=True)
        finally:
            self.asr_lock.release()
        text = result.text.strip()
        if text and turn not in self._transcribing:
            asr_ms = result.asr_ms
            self.emit(PartialTranscript(turn, time.monotonic_ns(), text, 1000 * audio.size / 16000, asr_ms))

    def transcribe_overlap(self, turn: int, audio: np.ndarray) -> str:
        """The words of speech over a reply (greedy: they only decide what the speech was).

        Nothing when Whisper itself doubts there was speech (``no_speech_prob``): a hum or a
        cough it would otherwise put words to.
        """
        with self.asr_lock:
            result = self.transcriber.transcribe(audio, quick=True)
        return result.text.strip() if result.no_speech_prob < OVERLAP_NO_SPEECH else ""

    def dialogue_reply(self) -> str:
        """The last reply as generated (what a reader saw when nothing is spoken)."""
        return self.dialogue.turns[-1].assistant if self.dialogue.turns else ""

    def _generate(
        self,
        turn: int,
        text: str,
        say: Callable[[int, str], None],
        cancel: threading.Event,
        gate: ReplyGate,
    ) -> Reply:
        """Stream the reply's sentences to ``say``; unconfirmed, it pauses after the first one."""
        if not gate.confirmed.is_set():
            self.emit(SpeculationStarted(turn, time.monotonic_ns(), "llm"))
        reply = self.dialogue.ask(text, cancel, held=True)
        splitter = self.make_splitter()
        try:
            self._stream_reply(turn, reply, say, cancel, gate, splitter)
        except ServerUnavailable as e:  # --llm-server: the text so far is kept, the next turn reconnects
            logger.warning("turn %d: %s", turn, e)
            self._server_lost.add(turn)
        return reply

    def _stream_reply(
        self,
        turn: int,
        reply: Reply,
        say: Callable[[int, str], None],
        cancel: threading.Event,
        gate: ReplyGate,
        splitter: Splits,
    ) -> None:
        """Feed the reply's tokens to the splitter and its sentences to ``say``."""
        index = 0
        submitted = False
        for chunk in reply:
            if not submitted:  # the stats know the prompt split only once iteration began
                submitted = True
                s = reply.stats
                self.emit(
                    PromptSubmitted(turn, s.t_submit_ns, s.prompt_tokens, s.reused_tokens, s.network_ms)
                )
            if chunk.token_id >= 0:
                self.emit(TokenGenerated(turn, chunk.t_ns, chunk.index, chunk.text))
            for sentence in splitter.push(chunk.text):
                self.emit(SentenceReady(turn, time.monotonic_ns(), index, sentence))
                say(index, sentence)
                index += 1
            # Speculating: one sentence ready to play is enough until the user is done.
            if index and not gate.wait(cancel):
                break
        if not submitted:
            s = reply.stats
            self.emit(PromptSubmitted(turn, s.t_submit_ns, s.prompt_tokens, s.reused_tokens))
        if not cancel.is_set() and not gate.discarded:
            for sentence in splitter.flush():
                self.emit(SentenceReady(turn, time.monotonic_ns(), index, sentence))
                say(index, sentence)
                index += 1

    def _snapshot(self) -> list[Event]:
        with self._events_lock:
            return list(self._events)

    def _forget_other_turns(self, turn: int) -> None:
        """Keep only ``turn``'s events (and later turns' already heard): earlier turns are done."""
        with self._events_lock:
            self._events[:] = [e for e in self._events if e.turn_id >= turn]

    def _finish(self, turn: int) -> TurnRecord:
        self._transcribing.discard(turn)
        self._server_lost.discard(turn)
        record = build_record(
            turn,
            self._snapshot(),
            backend=self.dialogue.decoder.name,
            backend_fallback=self.dialogue.decoder.fallback,
            llm_model=self.llm_model,
            asr_model=self.transcriber.description,
            tts_voice=self.synthesizer.description if self.synthesizer is not None else "",
        )
        self.records.append(record)
        if self.options.log_path:
            append_line(self.options.log_path, record.to_json())
        self.emit(TurnDone(turn, time.monotonic_ns(), record))
        return record


def _silent(_index: int, _sentence: str) -> None:
    """Where sentences go when nothing speaks (text only)."""

"""``assistant run``: the voice loop headless, on a WAV file or on the live audio devices."""

from __future__ import annotations

import io
import logging
import signal
import sys
import threading
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

from assistant.events import (
    AudioDeviceLost,
    AudioDeviceRestored,
    BargeIn,
    CancelReason,
    EchoState,
    Event,
    OverlapHeard,
    OverlapVerdict,
    PartialTranscript,
    ReplyPaused,
    SentenceReady,
    SpeechEnded,
    SpeechResumed,
    SpeechStarted,
    TranscriptReady,
    TurnCancelled,
    TurnDecision,
    TurnDone,
    TurnHeld,
)
from assistant.observe.latency import TurnRecord
from assistant.stages.asr import Transcriber
from assistant.stages.audio import FileSink, Microphone, Speaker
from assistant.stages.audio_file import stderr_progress
from assistant.stages.devices import device_notice
from assistant.stages.endpoint import TurnOptions
from assistant.stages.recording import NoSpeechInFile, find_utterance
from assistant.stages.vad import SAMPLE_RATE_HZ, EndOfTurn, Endpointer, VadOptions
from assistant.turns.duplex import Duplex
from assistant.turns.live import LiveLoop
from assistant.turns.pipeline import VoicePipeline
from assistant.turns.protocols import PipelineOptions
from store.files import atomic_write

if TYPE_CHECKING:
    from assistant.app import Session
    from assistant.config import Settings

logger = logging.getLogger(__name__)

LISTENING_WAIT_NS = 2_000_000_000  # at most this long for the microphone's first audio at start


def write_wav(path: Path, audio: np.ndarray) -> None:
    """16 kHz mono 16-bit PCM, written whole or not at all (:func:`~store.files.atomic_write`)."""
    pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
    with atomic_write(path) as f, wave.open(f, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE_HZ)
        w.writeframes(pcm.tobytes())


def run_file(
    pipeline: VoicePipeline,
    vad: VadOptions,
    audio: np.ndarray,
    src: Path,
    dst: Path | None,
    policy: EndOfTurn | None = None,
) -> TurnRecord:
    """One turn from a recorded question; the reply goes to ``dst`` (a WAV) if given.

    Timing: the turn's clock starts as if the speaker had just stopped: the speech end is
    placed the measured endpointing delay before processing begins. Nothing is speculated
    (there is no live pause to work in).
    """
    speech, delay_ms = find_utterance(audio, vad, src, policy)
    now = time.monotonic_ns()
    utterance = SpeechEnded(1, now, speech_end_t_ns=now - int(delay_ms * 1e6), audio=speech)
    sink = FileSink()
    record = pipeline.run_turn(utterance, sink, threading.Event())
    assert record is not None  # confirmed from the start: never discarded
    if dst is not None:
        write_wav(dst, sink.audio())
    return record


def fan_out(*sinks: Callable[[Event], None] | None) -> Callable[[Event], None]:
    """One event callback that hands each event to every sink given (``None`` ones skipped)."""
    live = [sink for sink in sinks if sink is not None]

    def emit(event: Event) -> None:
        for sink in live:
            sink(event)

    return emit


class ConsoleReporter:
    """Prints what a user of ``run --no-tui`` wants to see, one line per event of interest."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out
        self.lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        """Print the event if it is one a user cares about."""
        line = None
        if isinstance(event, SpeechStarted):
            line = f"[turn {event.turn_id}] hearing..."
        elif isinstance(event, PartialTranscript):
            line = f"[turn {event.turn_id}] ... {event.text}"
        elif isinstance(event, SpeechResumed):
            after = " after the endpoint: the reply waits" if event.after_endpoint else ""
            line = f"[turn {event.turn_id}] you went on{after}"
        elif isinstance(event, TurnDecision) and event.reason == "model":
            verdict = "done" if event.complete else "not done, listening on"
            line = (
                f"[turn {event.turn_id}] turn detector: {verdict} (p={event.probability:.2f}, "
                f"{event.inference_ms:.0f} ms, after {event.silence_ms:.0f} ms of silence)"
            )
        elif isinstance(event, TurnDecision) and event.reason == "question":
            line = f"[turn {event.turn_id}] done: a question, after {event.silence_ms:.0f} ms of silence"
        elif isinstance(event, BargeIn):
            reaction_ms = (event.t_ns - event.onset_t_ns) / 1e6
            line = f"[turn {event.turn_id}] interrupted: reply stopped {reaction_ms:.0f} ms after you spoke"
        elif isinstance(event, EchoState):
            line = event.reason
        elif isinstance(event, ReplyPaused):
            reaction_ms = (event.t_ns - event.onset_t_ns) / 1e6
            line = f"[turn {event.turn_id}] reply paused {reaction_ms:.0f} ms after you spoke over it"
        elif isinstance(event, OverlapHeard) and event.verdict in (
            OverlapVerdict.NOISE,
            OverlapVerdict.BACKCHANNEL,
        ):
            what = f'"{event.text}"' if event.text else "no words"
            line = f"[turn {event.turn_id}] {what} over the reply ({event.verdict}): it plays on"
        elif isinstance(event, OverlapHeard) and event.verdict is OverlapVerdict.STOP:
            line = f'[turn {event.turn_id}] "{event.text}": reply stopped'
        elif isinstance(event, TurnCancelled) and event.reason == CancelReason.CONTINUED:
            line = f"[turn {event.turn_id}] you went on with the question: it is answered whole"
        elif isinstance(event, TurnHeld):
            line = f"[turn {event.turn_id}] long speech cut for length: the answer waits until you stop"
        elif isinstance(event, TranscriptReady):
            line = f"[turn {event.turn_id}] you: {event.text or '(nothing recognised)'}"
            for start_s, end_s in event.unclear_s:
                lost = f"{start_s:.1f}-{end_s:.1f} s could not be transcribed (left out)"
                line += f"\n[turn {event.turn_id}] {lost}"
        elif isinstance(event, SentenceReady):
            line = f"[turn {event.turn_id}] assistant: {event.text}"
        elif isinstance(event, TurnDone) and isinstance(event.record, TurnRecord):
            line = event.record.summary()
        elif isinstance(event, AudioDeviceLost | AudioDeviceRestored):
            line = device_notice(event)
        elif isinstance(event, TurnCancelled) and event.reason == CancelReason.SPEAKER_LOST:
            line = f"[turn {event.turn_id}] reply cut: the speaker was lost (its text above is kept)"
        elif isinstance(event, TurnCancelled) and event.reason == CancelReason.LLM_SERVER_LOST:
            line = (
                f"[turn {event.turn_id}] reply cut: the LLM server stopped answering (the text so far is "
                "kept; the next turn connects again)"
            )
        elif isinstance(event, TurnCancelled) and event.reason == CancelReason.MICROPHONE_LOST:
            line = f"[turn {event.turn_id}] dropped: the microphone was lost while you spoke"
        elif isinstance(event, TurnCancelled) and event.reason == CancelReason.NOT_HEARD:
            line = (
                f"[turn {event.turn_id}] dropped: not heard to its end (the microphone was muted, or"
                " closed as a reply began in half duplex)"
            )
        if line:
            with self.lock:
                print(line, file=self.out, flush=True)


def run_live(
    pipeline: VoicePipeline,
    mic: Microphone,
    speaker: Speaker,
    endpointer: Endpointer,
    turn: TurnOptions,
    out: TextIO = sys.stdout,
    typed: TextIO | None = sys.stdin,
    duplex: Duplex | None = None,
) -> int:
    """Listen and answer until Ctrl-C (SIGINT), SIGTERM or SIGHUP; closes streams and joins threads.

    Each line read from ``typed`` (standard input) is answered as a typed turn, spoken too,
    after the turn in progress; the end of that input leaves the microphone listening.
    """
    loop = LiveLoop(pipeline, mic, speaker, endpointer, turn=turn, duplex=duplex)
    done = threading.Event()

    def read_typed() -> None:
        assert typed is not None
        if isinstance(typed, io.TextIOWrapper):
            typed.reconfigure(errors="replace")  # a bad byte becomes U+FFFD, not a dead reader
        for line in typed:
            if text := line.strip():
                loop.submit_text(text)

    if typed is not None:
        threading.Thread(target=read_typed, name="typed-input", daemon=True).start()  # blocks in read

    def stop(_sig: int, _frame: object) -> None:
        done.set()

    stops = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # the terminal closed; not under nohup
        stops.append(signal.SIGHUP)
    previous = {s: signal.signal(s, stop) for s in stops}
    loop.start()
    # "listening" once the microphone delivers audio (a stream can open on a sound server that
    # is going away); one that stays silent is the device watch's to report, soon after.
    deadline_ns = time.monotonic_ns() + LISTENING_WAIT_NS
    while not mic.first_beat_ns and not mic.lost.is_set() and time.monotonic_ns() < deadline_ns:
        time.sleep(0.02)
    print(
        f"listening on {mic.name!r}, speaking on {speaker.name!r}; type a line to ask in text; Ctrl-C quits",
        file=out,
        flush=True,
    )
    try:
        while not done.wait(0.2):
            pass
    finally:
        loop.stop()
        mic.close()
        speaker.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    print("stopped", file=out, flush=True)
    return 0


def run_headless(
    settings: Settings,
    input_wav: Path | None,
    audio: np.ndarray | None,
    output: Path | None,
    events_path: Path | None = None,
    log_path: Path | None = None,
) -> int:
    """``run --no-tui`` (or ``--output``): build the session, answer the file's question or run live.

    Events go to the console, to ``events_path`` (JSON lines) and to the metrics server when
    one is configured; turn records to ``log_path``.
    """
    from assistant.app import build_session
    from assistant.observe.latency import EventLog
    from assistant.observe.metrics import serving

    event_log = EventLog(events_path) if events_path else None
    file_mode = input_wav is not None and audio is not None
    try:
        with serving(settings.metrics) as metrics:
            session = build_session(
                settings,
                devices=not file_mode,
                asr=True if file_mode else None,
                tts=True if file_mode else None,
                emit=fan_out(ConsoleReporter(), event_log, metrics),
                log_path=log_path,
                engine_events=metrics.engine_event if metrics else None,
            )
            if metrics is not None:
                asr_model = session.transcriber.description if session.transcriber else ""
                metrics.attach(session.dialogue.decoder, settings.models.llm, asr_model)
            return serve_session(session, settings, input_wav, audio, output)
    finally:
        if event_log:
            event_log.close()


def serve_session(
    session: Session,
    settings: Settings,
    input_wav: Path | None,
    audio: np.ndarray | None,
    output: Path | None,
) -> int:
    """Answer the file's question, or run the live loop (text chat without devices); closes ``session``."""
    from assistant.modes.chat import run_chat

    for notice in session.notices:
        print(f"notice: {notice}", file=sys.stderr)
    try:
        if input_wav is not None and audio is not None:
            if isinstance(session.transcriber, Transcriber):  # a long question says how far it is
                session.transcriber.progress = stderr_progress(input_wav, "transcribing")
            record = run_file(session.pipeline, settings.vad, audio, input_wav, output, session.turn_policy)
            return 0 if not record.cancelled else 1
        if session.mic is None or session.speaker is None:
            return run_chat(session.dialogue)
        mic, speaker = session.mic, session.speaker
        duplex = session.duplex
        session.mic = session.speaker = None  # run_live closes them
        endpointer, turn = session.endpointer(), session.settings_turn
        return run_live(session.pipeline, mic, speaker, endpointer, turn, duplex=duplex)
    finally:
        session.close()


__all__ = [
    "ConsoleReporter",
    "NoSpeechInFile",
    "PipelineOptions",
    "run_file",
    "run_headless",
    "run_live",
    "serve_session",
    "write_wav",
]

"""Pure latency bookkeeping: a turn's events -> its breakdown; percentiles; JSON lines.

Each metric names its start and stop event:

- endpointing_ms: last speech sample captured (``SpeechEnded.speech_end_t_ns``) -> endpoint
  detected (``SpeechEnded.t_ns``; with turn detection this includes the model's inference)
- turn_detection_ms: inference time of the Smart Turn score that ended the turn
  (``TurnDecision.inference_ms``; ``None`` with fixed silence or at the silence cap)
- queued_ms: endpoint detected -> the turns before it done (``TranscriptReady.queued_until_t_ns``),
  when the turn waited for them: a typed question answered first, a reply that played on over
  the speech (barge-in off); 0 when it did not wait
- asr_ms: endpoint detected (or the end of that wait) -> ``TranscriptReady``; 0 when
  speculative ASR finished inside the silence wait (what the user waited for ASR after the
  endpoint)
- ttft_ms: ``PromptSubmitted`` -> first ``TokenGenerated`` (token id on the host)
- network_ms: the part of ``ttft_ms`` outside a served decoder's model (``--llm-server``:
  network, gRPC, Triton's queue): client TTFT - the server's arrival -> first token; else None
- first_sentence_ms: ``PromptSubmitted`` -> first ``SentenceReady``
- tts_first_audio_ms: the later of first ``SentenceReady`` and the endpoint -> first
  ``AudioStarted`` (render + device hand-off)
- voice_to_voice_ms: last speech sample captured -> ``AudioStarted`` (what the user waits)
- speculated_ms: ASR + LLM work that ran inside the silence wait: ``SpeculationStarted`` ->
  the earlier of the endpoint and the first sentence (0 without speculation)
- tokens_per_s: tokens after the first per second, first -> last ``TokenGenerated``
- barge_in_ms: the interrupting speech's first sample (``BargeIn.onset_t_ns``) -> the reply
  paused (``BargeIn.t_ns``): the app's reaction; the output device's buffer
  (``BargeIn.device_latency_ms``) still plays after it. ``None`` without a barge-in
- erle_db, echo_delay_ms: not spans: the echo canceller's reading over the reply
  (``EchoMeasured`` after it played): echo return loss enhancement (dB) and the echo's delay
  (ms). ``None`` when the microphone is not echo-cancelled

Speech over the reply (full duplex) is counted per reply, on the record of the reply's turn:
``overlaps`` counts ``ReplyPaused`` (speech began over the reply and paused it),
``false_barge_ins`` counts ``ReplyResumed`` (paused for no words or a backchannel, then played
on), ``overlap_heard`` says what each was (``OverlapHeard``: ``backchannel 'Uh-huh.': resumed
after 800 ms``), and ``continued`` is true when the user went on with the question over the
reply (``TurnCancelled`` ``continued``): the reply was dropped and the next turn, whose
``held_turns`` names this one, answered the whole question.

A turn whose speculative work was discarded (the user went on speaking) keeps one record:
the events of the discarded attempts are skipped, ``discarded`` counts them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from assistant.events import (
    AudioStarted,
    BargeIn,
    CancelReason,
    EchoMeasured,
    Event,
    OverlapHeard,
    PartialTranscript,
    PlaybackEnded,
    PromptSubmitted,
    ReplyPaused,
    ReplyResumed,
    SentenceReady,
    SpeculationDiscarded,
    SpeculationStarted,
    SpeechEnded,
    SpeechResumed,
    TokenGenerated,
    TranscriptReady,
    TurnCancelled,
    TurnDecision,
)
from store.files import LineAppender

STAGES = (
    "endpointing_ms",
    "turn_detection_ms",
    "asr_ms",
    "ttft_ms",
    "first_sentence_ms",
    "tts_first_audio_ms",
    "voice_to_voice_ms",
)
DUPLEX_METRICS = ("barge_in_ms", "erle_db", "echo_delay_ms")  # per reply, with full duplex
P999_MIN_SAMPLES = 1000  # below this, one sample in a thousand is not yet there to measure


@dataclass
class TurnRecord:
    """Everything measured about one turn (timestamps in monotonic ns, durations in ms)."""

    turn_id: int
    transcript: str = ""
    reply: str = ""
    backend: str = ""
    backend_fallback: str = ""  # why --backend auto runs ``backend`` and not the TensorRT it picked
    llm_model: str = ""
    asr_model: str = ""
    tts_voice: str = ""  # "piper en_US-joe-medium", "pyttsx3 en-us"; empty without TTS (text only)
    cancelled: str = ""
    timestamps_ns: dict[str, int] = field(default_factory=dict)
    tokens: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    turn_detector: str = ""  # what ended the turn: "model 0.93", "max silence", "fixed silence"
    turn_probability: float | None = None
    resumed: int = 0  # times the user went on after a pause (or after the endpoint)
    discarded: int = 0  # speculative attempts thrown away
    partials: int = 0  # partial transcripts shown while the user spoke
    held_turns: list[int] = field(default_factory=list)  # earlier turns whose speech this one answers
    overlaps: int = 0  # times speech over the reply paused it (ReplyPaused)
    false_barge_ins: int = 0  # pauses that resumed: no words or a backchannel (ReplyResumed)
    overlap_heard: list[str] = field(default_factory=list)  # each overlap's verdict: "stop 'Stop.'"
    continued: bool = False  # the user went on with this question: reply dropped, the next turn answers
    asr_window: str = ""  # "fit" or "full": the Whisper window that gave the transcript
    asr_fell_back: bool = False  # the fitted window's decode looked wrong; the 30 s window took over
    unclear_s: list[list[float]] = field(default_factory=list)  # stretches ASR could not transcribe
    metrics: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> str:
        """One JSON object on one line."""
        return json.dumps(asdict(self), separators=(",", ":"))

    def summary(self) -> str:
        """``turn 3 | v2v 812 ms = endpoint 416 + asr 120 + ... | 14.2 tok/s``."""
        m = self.metrics

        def ms(key: str) -> str:
            value = m.get(key)
            return "n/a" if value is None else f"{value:.0f}"

        detector = f" ({self.turn_detector})" if self.turn_detector else ""
        overlap = f" | done in the wait {ms('speculated_ms')}" if m.get("speculated_ms") else ""
        duplex = "".join(f" | {note}" for note in self.duplex_notes())
        return (
            f"turn {self.turn_id} | voice-to-voice {ms('voice_to_voice_ms')} ms | endpointing "
            f"{ms('endpointing_ms')}{detector} | asr {ms('asr_ms')} | ttft {ms('ttft_ms')} | "
            f"first sentence {ms('first_sentence_ms')} | tts first audio {ms('tts_first_audio_ms')}"
            f"{overlap} | {m.get('tokens_per_s') or 0:.1f} tok/s{duplex}"
        )

    def duplex_notes(self) -> list[str]:
        """What happened over the reply, in words: ``barge-in 143 ms``, the overlaps, ``ERLE 24 dB``."""
        m = self.metrics
        notes = [] if m.get("barge_in_ms") is None else [f"barge-in {m['barge_in_ms']:.0f} ms"]
        notes += self.overlap_heard
        if self.continued:
            notes.append("continued: answered with the next turn")
        if m.get("erle_db") is not None:
            delay = "" if m.get("echo_delay_ms") is None else f", echo delay {m['echo_delay_ms']:.0f} ms"
            notes.append(f"ERLE {m['erle_db']:.0f} dB{delay}")
        return notes


def _ms(start: int | None, stop: int | None) -> float | None:
    if not start or not stop:
        return None
    return (stop - start) / 1e6


ATTEMPT_EVENTS = (
    SpeculationStarted,
    TranscriptReady,
    PromptSubmitted,
    TokenGenerated,
    SentenceReady,
    AudioStarted,
    PlaybackEnded,
    TurnCancelled,
)  # belong to one run of the pipeline; a discarded run's are not the turn's


def build_record(
    turn_id: int,
    events: Iterable[Event],
    *,
    backend: str = "",
    llm_model: str = "",
    asr_model: str = "",
    backend_fallback: str = "",
    tts_voice: str = "",
) -> TurnRecord:
    """Fold one turn's events into its record (pure: no clock, no I/O)."""
    rec = TurnRecord(
        turn_id, backend=backend, backend_fallback=backend_fallback, llm_model=llm_model, asr_model=asr_model
    )
    rec.tts_voice = tts_voice
    ts = rec.timestamps_ns
    tokens: list[TokenGenerated] = []
    mine = [e for e in events if e.turn_id == turn_id]
    discards = [i for i, e in enumerate(mine) if isinstance(e, SpeculationDiscarded)]
    last_discard = discards[-1] if discards else -1
    rec.discarded = len(discards)
    decision: TurnDecision | None = None
    network_ms: float | None = None
    barge_in: BargeIn | None = None
    echo: EchoMeasured | None = None
    for i, e in enumerate(mine):
        if isinstance(e, ATTEMPT_EVENTS) and i < last_discard:
            continue
        if isinstance(e, SpeechEnded):
            ts["speech_end"] = e.speech_end_t_ns
            ts["endpoint"] = e.t_ns
        elif isinstance(e, TurnDecision):
            decision = e
        elif isinstance(e, SpeechResumed):
            rec.resumed += 1
        elif isinstance(e, PartialTranscript):
            rec.partials += 1
        elif isinstance(e, SpeculationStarted) and e.stage == "asr":
            ts["speculation_start"] = e.t_ns
        elif isinstance(e, TranscriptReady):
            ts["transcript"] = e.t_ns
            rec.transcript = e.text
            rec.held_turns = list(e.held_turns)
            rec.asr_window, rec.asr_fell_back = e.asr_window, e.asr_fell_back
            rec.unclear_s = [list(span) for span in e.unclear_s]
            if e.queued_until_t_ns:
                ts["queued_until"] = e.queued_until_t_ns
        elif isinstance(e, PromptSubmitted):
            ts["prompt_submitted"] = e.t_ns
            rec.prompt_tokens, rec.reused_tokens = e.prompt_tokens, e.reused_tokens
            network_ms = e.network_ms
        elif isinstance(e, TokenGenerated):
            tokens.append(e)
            ts.setdefault("first_token", e.t_ns)
            ts["last_token"] = e.t_ns
        elif isinstance(e, SentenceReady):
            ts.setdefault("first_sentence", e.t_ns)
            rec.reply = f"{rec.reply} {e.text}".strip()
        elif isinstance(e, AudioStarted):
            ts.setdefault("first_audio", e.t_ns)
        elif isinstance(e, PlaybackEnded):
            ts["playback_end"] = e.t_ns
        elif isinstance(e, TurnCancelled):
            rec.cancelled = e.reason
            rec.reply = e.heard_text
            rec.continued = e.reason == CancelReason.CONTINUED
        elif isinstance(e, ReplyPaused):
            rec.overlaps += 1
        elif isinstance(e, OverlapHeard):
            rec.overlap_heard.append(f"{e.verdict} '{e.text}'" if e.text else str(e.verdict))
        elif isinstance(e, ReplyResumed):
            rec.false_barge_ins += 1
            if rec.overlap_heard:  # the engine resumes right after the verdict that let it
                rec.overlap_heard[-1] += f": resumed after {e.paused_ms:.0f} ms"
        elif isinstance(e, BargeIn):
            barge_in = barge_in or e
        elif isinstance(e, EchoMeasured):
            echo = e
    if decision is not None:
        rec.turn_probability = decision.probability
        p = "" if decision.probability is None else f" {decision.probability:.2f}"
        rec.turn_detector = f"{decision.reason}{p}"
    rec.tokens = len(tokens)
    span = _ms(ts.get("first_token"), ts.get("last_token"))
    endpoint = ts.get("endpoint")
    spoken_from = max(ts.get("first_sentence") or 0, endpoint or 0) or None
    work_end = ts.get("first_sentence") or ts.get("transcript")
    speculated = None if not endpoint else 0.0
    if endpoint and ts.get("speculation_start"):
        speculated = max(_ms(ts["speculation_start"], min(endpoint, work_end or endpoint)) or 0.0, 0.0)
    asr_from = max(endpoint, ts.get("queued_until", 0)) if endpoint else None  # after any wait
    queued = _ms(endpoint, asr_from)
    asr = _ms(asr_from, ts.get("transcript"))
    rec.metrics = {
        "endpointing_ms": _ms(ts.get("speech_end"), endpoint),
        "turn_detection_ms": decision.inference_ms if decision and decision.reason == "model" else None,
        "queued_ms": queued,
        "asr_ms": None if asr is None else max(asr, 0.0),
        "ttft_ms": _ms(ts.get("prompt_submitted"), ts.get("first_token")),
        "network_ms": network_ms,
        "first_sentence_ms": _ms(ts.get("prompt_submitted"), ts.get("first_sentence")),
        "tts_first_audio_ms": _ms(spoken_from, ts.get("first_audio")),
        "voice_to_voice_ms": _ms(ts.get("speech_end"), ts.get("first_audio")),
        "speculated_ms": speculated,
        "tokens_per_s": (len(tokens) - 1) / (span / 1e3) if span else None,
        "barge_in_ms": _ms(barge_in.onset_t_ns, barge_in.t_ns) if barge_in else None,
        "erle_db": echo.erle_db if echo else None,
        "echo_delay_ms": echo.delay_ms if echo else None,
    }
    return rec


def percentiles(records: Sequence[TurnRecord], keys: Sequence[str] = STAGES) -> dict[str, dict[str, float]]:
    """P50/P95/P99/P99.9/max and the sample count ``n`` per metric, over the turns that have it.

    P99.9 is numpy's interpolated percentile: under :data:`P999_MIN_SAMPLES` samples it
    lies between the largest values and says little more than ``max``.
    """
    out = {}
    for key in keys:
        values = [r.metrics[key] for r in records if r.metrics.get(key) is not None]
        if values:
            arr = np.asarray(values, dtype=np.float64)
            out[key] = {
                "p50": float(np.percentile(arr, 50)),
                "p95": float(np.percentile(arr, 95)),
                "p99": float(np.percentile(arr, 99)),
                "p999": float(np.percentile(arr, 99.9)),
                "max": float(arr.max()),
                "n": float(arr.size),
            }
    return out


def event_dict(event: Event) -> dict[str, object]:
    """An event as plain JSON values: its type, stamps and fields (audio becomes ``audio_ms``)."""
    out: dict[str, object] = {"event": type(event).__name__}
    for f in fields(event):
        value = getattr(event, f.name)
        if isinstance(value, np.ndarray):
            out["audio_ms"] = round(1000.0 * value.size / 16000, 1)
        elif isinstance(value, TurnRecord):
            out["metrics"] = value.metrics
        else:
            out[f.name] = value
    return out


class EventLog:
    """Appends every event to a JSON-lines file (``run --events``); callable from any thread."""

    def __init__(self, path: Path) -> None:
        self._file = LineAppender(path)
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        """Write one event as one whole line."""
        line = json.dumps(event_dict(event), separators=(",", ":"))
        with self._lock:
            self._file.write_line(line)

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._file.close()

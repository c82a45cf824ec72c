"""The rest of a paused question said just after its reply began, in closed loop: which words survive.

The app's capture path without its threads or devices (real AEC3, the residual gate, Silero
VAD, tiny.en's joined pass of :meth:`~assistant.turns.hearing.Hearing.transcribe_overlap`): the
first half "I would like to know" in silence, the reply (espeak-ng) 0.5 s after it, then "how
many days are in a week?" ``--after`` seconds after the reply's first sound, all in the Piper
voice at four rates. The reply's echo reaches the microphone as on the echo rig (60 ms, -13 dB,
a reflection 23 ms later at -19 dB, a drift of 0.1 ms a second; ``--echo-db`` sets its level);
the reply stops 100 ms after the rest's onset. Before it the canceller heard ``--warm``:
``reply`` (5 s of a reply: a canceller that has converged on speech; ``reply:SECONDS``),
``probe`` (the app's start-up hiss alone, as before a session's first reply) or
``probe:SECONDS:DBFS``. The question joined to the rest is transcribed from each view of
the rest: ``gated`` (the app's), ``aec3`` (AEC3's output before the gate), ``linear`` (the echo
subtracted by a linear fit alone, as the judge of a stop request hears it:
``Duplex.unsuppressed``; none without a second of echo before the speech), ``near`` (the
microphone as it came in, echo and all) and ``clean`` (the user alone):

    python -m bench.continuation_closed_loop --warm probe --json continuation-probe.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from assistant.config import ModelSettings
from assistant.config.sections import EchoOptions, VadOptions
from assistant.events import SpeechEnded, SpeechOnset
from assistant.stages.asr import AsrOptions, Transcriber
from assistant.stages.echo import EchoCanceller, load_processor
from assistant.stages.echo_linear import AudioTail, EchoTrack
from assistant.stages.vad import SAMPLE_RATE_HZ, Endpointer
from assistant.turns.duplex import probe_signal
from assistant.turns.hearing import joined
from bench.corpus import ECHO_REPLY, PAUSED
from bench.duplex import words_lost
from bench.duplex_rig import piper_speech, utterance
from bench.results import write_results
from bench.stop_closed_loop import BLOCK, PIPER_RATES, add_echo, cancel_block
from store.bundled import ModelStore

FIRST, REST, _ = PAUSED[0]  # "I would like to know", "how many days are in a week?"
VIEWS = ("gated", "aec3", "linear", "near", "clean")
WARM_S = 5.0
PAUSE_MS = 100  # the reply stops this long after the rest's onset (the app: ~15-50 ms + 64 ms)
DRIFT = 1e-4  # the rig's echo delay grows 0.1 ms a second


def warmed(warm: str, n: int, reply: np.ndarray) -> np.ndarray:
    """The far end, ``n`` samples of silence but what the canceller heard in the first :data:`WARM_S`."""
    far, end = np.zeros(n, np.float32), int(WARM_S * SAMPLE_RATE_HZ)
    if warm.startswith("reply"):
        seconds = float(warm.split(":")[1]) if ":" in warm else WARM_S
        far[end - int(seconds * SAMPLE_RATE_HZ) : end] = reply[: int(seconds * SAMPLE_RATE_HZ)]
    elif warm.startswith("probe"):
        seconds, dbfs = map(float, warm.split(":")[1:]) if ":" in warm else (0.8, -24.0)
        hiss = probe_signal(seconds, dbfs)
        far[end - hiss.size : end] = hiss
    return far


def trial(asr: Transcriber, reply: np.ndarray, first: np.ndarray, rest: np.ndarray, after_s: float,
          warm: str, echo_db: float = -13.0) -> dict[str, Any]:  # fmt: skip
    """The joined transcript from each view, and when the rest's onset came after the reply's start."""
    question_at = int((WARM_S + 1.5) * SAMPLE_RATE_HZ)
    reply_at = question_at + first.size + SAMPLE_RATE_HZ // 2
    rest_at = reply_at + int((after_s - 0.2) * SAMPLE_RATE_HZ)  # the WAV's 0.2 s of silence first
    n = rest_at + rest.size + 2 * SAMPLE_RATE_HZ
    far = warmed(warm, n, reply)
    far[reply_at:] = reply[: n - reply_at]
    user = np.zeros(n, np.float32)
    user[question_at : question_at + first.size] = first
    user[rest_at : rest_at + rest.size] = rest
    mic = np.zeros(n, np.float32)
    options = EchoOptions(enabled="on")
    canceller = EchoCanceller(options, load_processor(options))
    endpointer = Endpointer(VadOptions())
    tails = {view: AudioTail(20) for view in ("aec3", "near", "clean")}
    track = EchoTrack(20)
    cut, question, onset_s = None, None, None
    paths = ((60, 10 ** (echo_db / 20)), (83, 10 ** ((echo_db - 6) / 20)))
    for i in range(0, n - BLOCK + 1, BLOCK):
        add_echo(mic, far, i, paths, DRIFT)
        out, t_end_ns = cancel_block(canceller, track, far, mic[i : i + BLOCK] + user[i : i + BLOCK], i)
        tails["aec3"].add(out.audio, t_end_ns)
        tails["near"].add(out.near, t_end_ns)
        clean_end_ns = 10**12 + (i + BLOCK - 1) * 1_000_000_000 // SAMPLE_RATE_HZ
        tails["clean"].add(user[i : i + BLOCK], clean_end_ns)
        endpointer.over_reply = reply_at <= i and (cut is None or i < cut)
        for event in endpointer.feed(out.vad, t_end_ns):
            if isinstance(event, SpeechEnded) and question is None:
                question = event.audio
                endpointer.seal()  # the reply starts: later speech is a new turn
            elif isinstance(event, SpeechOnset) and question is not None and cut is None:
                cut = i + BLOCK + PAUSE_MS * 16
                far[cut:] = 0.0
                onset_s = ((event.onset_t_ns - 10**12) * SAMPLE_RATE_HZ / 1e9 - reply_at) / SAMPLE_RATE_HZ
            elif isinstance(event, SpeechEnded) and question is not None:
                views = {"gated": event.audio}
                for view, tail in tails.items():
                    span = tail.span(event.t_ns, event.audio.size)
                    if span is not None:
                        views[view] = span
                if (echo := track.span(event.t_ns, event.audio.size)) is not None:
                    if (cleaned := echo.cleaned()) is not None:
                        views["linear"] = cleaned
                texts = {v: asr.transcribe(joined(question, a)).text.strip() for v, a in views.items()}
                return {"onset_s": onset_s, "texts": texts, "lost": {v: lost(t) for v, t in texts.items()}}
    return {"onset_s": onset_s, "texts": {}, "lost": {}}


def lost(text: str) -> list[str]:
    """The words of :data:`REST` missing from ``text`` (as ``bench.duplex`` counts words lost)."""
    return words_lost(REST, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warm", default="probe", help="reply, probe or probe:SECONDS:DBFS (above)")
    parser.add_argument(
        "--after", default="0.1,0.25,0.4,0.6", help="seconds after the reply's start, ',' between"
    )
    parser.add_argument(
        "--echo-db", type=float, default=-13.0, help="the echo's level (its reflection 6 dB under)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    asr = Transcriber(AsrOptions(device="cpu", cpu_threads=2), ModelStore(ModelSettings().store_dir))
    folder = Path(tempfile.mkdtemp(prefix="continuation-loop-"))
    reply = soundfile.read(utterance(folder, ECHO_REPLY, "reply"), dtype="float32")[0]
    rows = []
    for voice, wpm in PIPER_RATES.items():
        first, rest = piper_speech(FIRST, wpm), piper_speech(REST, wpm)
        for after_s in map(float, args.after.split(",")):
            row = {
                "voice": voice,
                "after_s": after_s,
                **trial(asr, reply, first, rest, after_s, args.warm, args.echo_db),
            }
            rows.append(row)
            missing = "; ".join(f"{v}: {' '.join(w)}" for v, w in row["lost"].items() if w)
            print(f"{voice} +{after_s:.2f} s: {missing or 'nothing lost'}", flush=True)
    words = len(lost(""))
    print(f"\n| view ({args.warm}) | rest words lost | trials with a loss | trials without the view |")
    print("|---|---:|---:|---:|")
    for view in VIEWS:
        losses = [len(r["lost"][view]) for r in rows if view in r["lost"]]
        trials = sum(x > 0 for x in losses)
        without = len(rows) - len(losses)
        print(f"| {view} | {sum(losses)} of {words * len(losses)} | {trials} of {len(losses)} | {without} |")
    if args.json:
        write_results(args.json, args, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Smart Turn beside speculative ASR in the pause: thread counts and order (issue [15], item 3).

In the live loop a pause starts the turn's speculative ASR after ``speculate_after_ms`` (128)
of silence and Smart Turn's first look after ``pause_ms`` (200), so on two cores the two meet.
This replays that pause for each held-out question (espeak-ng voices, ``bench.corpus``): ASR
starts at 0 on its own thread, Smart Turn scores 72 ms later on this one. Each setting is
``ASR threads x Smart Turn threads`` run together (``together``), or Smart Turn first and ASR
only after its look (``turn-first``); ``alone`` rows time each model by itself. Reported per
setting, median and P95 over the questions, in ms from the start of the speculation:

- ``turn``: Smart Turn's inference (the endpoint is decided at 72 + this);
- ``asr``: ASR done (the reply's LLM can start);
- ``both``: when the endpoint is decided and the transcript ready, whichever is later: what
  the reply waits for when Smart Turn says "complete" at its first look.

Settings run one question at a time through all of them, so the load of a shared machine
falls on each alike. Prints a table and writes JSON.

    python -m bench.turn_threads --repeats 3 --json docs/results/turn-threads.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from assistant.config import ModelSettings
from assistant.config.sections import AsrOptions, TurnOptions
from assistant.stages.asr import Transcriber
from assistant.stages.smart_turn import SmartTurn
from bench.corpus import HELD_OUT, VOICES
from bench.speech import silence, speak
from bench.startup import p95
from store.bundled import ModelStore

TURN_AFTER_MS = TurnOptions().pause_ms - TurnOptions().speculate_after_ms  # 72
SETTINGS = ["asr2+turn1", "asr1+turn1", "asr2+turn2", "asr1+turn2", "turn-first"]


def fresh(audio: np.ndarray) -> np.ndarray:
    """``audio`` with its first sample nudged by 1e-7: the Transcriber encodes it anew.

    (It keeps the encoder output of the last audio it saw, for stop spotting; a benchmark that
    transcribes one recording many times must not time that memo.)
    """
    copy = audio.copy()
    copy[0] += np.float32(1e-7) * np.float32(np.random.default_rng().integers(1, 1000))
    return copy


def run_pause(asr: Transcriber, turn: SmartTurn, audio: np.ndarray, order: str) -> dict[str, float]:
    """One pause: ASR from 0 (thread), Smart Turn at :data:`TURN_AFTER_MS`; times in ms."""
    times: dict[str, float] = {}
    audio = fresh(audio)
    t0 = time.perf_counter()
    go = threading.Event()

    def transcribe() -> None:
        if order == "turn-first":
            go.wait()
        asr.transcribe(audio)
        times["asr"] = (time.perf_counter() - t0) * 1000

    thread = threading.Thread(target=transcribe, name="asr")
    thread.start()
    time.sleep(max(0.0, TURN_AFTER_MS / 1000 - (time.perf_counter() - t0)))
    score = turn.score(audio)
    times["turn"] = score.inference_ms
    go.set()
    thread.join()
    times["both"] = max(TURN_AFTER_MS + times["turn"], times["asr"])
    return times


def main(argv: list[str] | None = None) -> int:
    """Time every setting on every question; print the table, write ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="passes over the questions")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    store = ModelStore(ModelSettings().store_dir)
    asrs = {n: Transcriber(AsrOptions(cpu_threads=n), store) for n in (1, 2)}
    turns = {n: SmartTurn.from_store(store, threads=n) for n in (1, 2)}
    for asr in asrs.values():
        asr.warm_up()
    for turn in turns.values():
        turn.warm_up()
    folder = Path(tempfile.mkdtemp(prefix="bench-turn-threads-"))
    audios = []
    for i, text in enumerate(HELD_OUT):
        voice, wpm = VOICES[i % len(VOICES)]
        audios.append(
            np.concatenate([silence(0.3), speak(text, folder, f"q{i}", wpm, voice), silence(0.128)])
        )
    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.repeats):
        for audio in audios:
            for n in (1, 2):
                t = time.perf_counter()
                asrs[n].transcribe(fresh(audio))
                rows.setdefault(f"alone: asr{n}", {}).setdefault("asr", []).append(
                    (time.perf_counter() - t) * 1000
                )
                rows.setdefault(f"alone: turn{n}", {}).setdefault("turn", []).append(
                    turns[n].score(audio).inference_ms
                )
            for setting in SETTINGS:
                if setting == "turn-first":
                    result = run_pause(asrs[2], turns[2], audio, "turn-first")
                else:
                    a, b = setting.split("+")
                    result = run_pause(asrs[int(a[-1])], turns[int(b[-1])], audio, "together")
                for key, value in result.items():
                    rows.setdefault(setting, {}).setdefault(key, []).append(value)
    print(f"{len(audios)} questions x {args.repeats}; ms from the start of the speculation")
    print(
        f"{'setting':16s} {'turn med':>9s} {'turn P95':>9s} {'asr med':>8s} {'asr P95':>8s} "
        f"{'both med':>9s} {'both P95':>9s}"
    )
    summary: dict[str, dict[str, float]] = {}
    for setting, values in rows.items():
        summary[setting] = {}
        cells = []
        for key in ("turn", "asr", "both"):
            if key in values:
                med, tail = statistics.median(values[key]), p95(values[key])
                summary[setting] |= {f"{key}_median_ms": med, f"{key}_p95_ms": tail}
                cells += [f"{med:9.0f}", f"{tail:9.0f}"]
            else:
                cells += [f"{'':>9s}", f"{'':>9s}"]
        print(f"{setting:16s} " + " ".join(cells))
    if args.json:
        record = {
            "command": " ".join(["python -m bench.turn_threads", *(argv or sys.argv[1:])]),
            "turn_after_ms": TURN_AFTER_MS,
            "summary": summary,
            "runs": rows,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stop spotting: the scores behind it and what it costs, on real tiny.en and espeak-ng speech.

For each phrase, clean and with 150 ms of its middle 25 dB down (AEC3's double-talk
suppression, as in ``tests/integration/test_stop_spotting.py``): what greedy tiny.en writes,
its mean log-probability a token, the best stop phrase's, what ``Hearing.transcribe_overlap``
returns, and its time with and without the scoring (median of ``--repeats``). Prints a table,
writes ``--json``:

    python -m bench.stop_spotting --json docs/results/stop-spotting.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile

from assistant.config import ModelSettings
from assistant.stages.asr import AsrOptions, Transcriber
from assistant.turns.hearing import Hearing
from assistant.turns.overlap_words import SPOTTED_STOPS
from bench.duplex_rig import utterance
from bench.results import write_results
from store.bundled import ModelStore

PHRASES = ["Please stop.", "Stop.", "Stop talking.", "Please continue.", "Please come here.", "Okay.",
           "What about Rome?", "Tell me more."]  # fmt: skip


def suppressed_middle(samples: np.ndarray, ms: int = 150, db: float = -25) -> np.ndarray:
    """``samples`` with ``ms`` in the middle of the speech taken down by ``db``."""
    loud = np.flatnonzero(np.abs(samples) > 0.02)
    middle, half = (loud[0] + loud[-1]) // 2, ms * 8
    out = samples.copy()
    out[middle - half : middle + half] *= 10 ** (db / 20)
    return out


def timed_ms(call, repeats: int) -> float:
    """Median wall time of ``call()`` in ms."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="ASR threads (the app's default on 2 cores)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    store = ModelStore(ModelSettings().store_dir)
    asr = Transcriber(AsrOptions(device="cpu", cpu_threads=args.threads), store)
    hearing = Hearing(asr, lambda _event: None)
    folder = Path(tempfile.mkdtemp(prefix="stop-spotting-"))
    rows = []
    for i, text in enumerate(PHRASES):
        clean, _ = soundfile.read(utterance(folder, text, f"p{i}"), dtype="float32")
        for kind, audio in (("clean", clean), ("suppressed", suppressed_middle(clean))):
            greedy = asr.transcribe(audio, quick=True).text.strip()
            heard, *stops = asr.phrase_logprobs(audio, [greedy, *SPOTTED_STOPS]) if greedy else [0.0]
            rows.append(
                {
                    "phrase": text,
                    "audio": kind,
                    "greedy": greedy,
                    "greedy_logprob": round(heard, 2),
                    "best_stop": SPOTTED_STOPS[int(np.argmax(stops))] if stops else "",
                    "best_stop_logprob": round(max(stops), 2) if stops else None,
                    "heard": hearing.transcribe_overlap(audio).text,
                    "greedy_ms": round(
                        timed_ms(lambda a=audio: asr.transcribe(a, quick=True), args.repeats), 1
                    ),
                    "overlap_ms": round(
                        timed_ms(lambda a=audio: hearing.transcribe_overlap(a), args.repeats), 1
                    ),
                }
            )
    print("| phrase | audio | greedy tiny.en | its log-prob | best stop phrase | its log-prob | heard | "
          "greedy ms | with scoring ms |")  # fmt: skip
    print("|---|---|---|---:|---|---:|---|---:|---:|")
    for r in rows:
        print(
            f"| {r['phrase']} | {r['audio']} | {r['greedy']} | {r['greedy_logprob']} | {r['best_stop']} | "
            f"{r['best_stop_logprob']} | {r['heard']} | {r['greedy_ms']} | {r['overlap_ms']} |"
        )
    if args.json:
        write_results(args.json, args, rows=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A question said in two halves: transcribed joined (what the app does) or its rest alone.

When the user goes on with a question after its reply began (docs/voice.md, "Full duplex"),
the overlap judge has already transcribed the rest, greedily and alone. Could those words
stand for the turn's ASR pass on the joined audio? Each paused question of ``bench.corpus``
(``PAUSED`` and ``ASR_PAUSED``, espeak-ng in the five ``VOICES``) is transcribed by the app's
Transcriber (tiny.en, fitted window) as the live loop would hear it: the first half after a
0.3 s pre-roll, then either the joined audio (first half, 0.3 s gap, rest) with beam 5, or the
rest alone, greedy and with beam 5, after the first half's words. Prints WER (jiwer) and ASR
time a setting, writes ``--json``:

    python -m bench.asr_halves --json docs/results/asr-halves.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import jiwer
import numpy as np

from assistant.config import load_settings
from assistant.stages.asr import Transcriber
from bench.corpus import ASR_PAUSED, PAUSED, VOICES
from bench.speech import speak
from bench.wer import normalize
from store.bundled import ModelStore

PRE_ROLL = np.zeros(4800, np.float32)  # the endpointer's 0.3 s before the onset
SETTINGS = ("joined, beam 5", "rest alone, greedy", "rest alone, beam 5")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    settings = load_settings(None, env={})
    asr = Transcriber(settings.asr, ModelStore(settings.models.store_dir))
    folder = Path(tempfile.mkdtemp(prefix="asr-halves-"))
    heard: dict[str, list[str]] = {s: [] for s in SETTINGS}
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    said = []
    for i, (first, rest, _keyword) in enumerate([*PAUSED, *ASR_PAUSED]):
        voice, wpm = VOICES[i % len(VOICES)]
        a = np.concatenate([PRE_ROLL, speak(first, folder, f"a{i}", wpm, voice)])
        b = np.concatenate([PRE_ROLL, speak(rest, folder, f"b{i}", wpm, voice)])
        before = asr.transcribe(a).text.strip()
        said.append(f"{first} {rest}")
        runs = {
            SETTINGS[0]: (np.concatenate([a, PRE_ROLL, b]), False, ""),
            SETTINGS[1]: (b, True, before),
            SETTINGS[2]: (b, False, before),
        }
        for setting, (audio, quick, prefix) in runs.items():
            start = time.perf_counter()
            text = asr.transcribe(audio, quick=quick).text.strip()
            times[setting].append(1000 * (time.perf_counter() - start))
            heard[setting].append(f"{prefix} {text}".strip())
        print(f"{i:2d} {voice:9s} " + " | ".join(heard[s][-1] for s in SETTINGS), flush=True)
    reference = [normalize(t) for t in said]
    rows = {
        s: {
            "wer_percent": round(100 * jiwer.wer(reference, [normalize(h) for h in heard[s]]), 1),
            "asr_ms_median": round(statistics.median(times[s]), 1),
            "asr_ms_max": round(max(times[s]), 1),
        }
        for s in SETTINGS
    }
    print("\n| setting | WER % | ASR ms median | max |\n|---|---:|---:|---:|")
    for s, r in rows.items():
        print(f"| {s} | {r['wer_percent']} | {r['asr_ms_median']} | {r['asr_ms_max']} |")
    if args.json:
        doc = {"command": "python -m bench.asr_halves", "said": said, "heard": heard, "rows": rows}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

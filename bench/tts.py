"""Time to first audio of the TTS engines side by side: pyttsx3 (espeak-ng) and Piper, in one run.

Each engine gets the same texts, the pieces the pipeline hands to TTS (a reply's first chunk
of five words or a clause, whole sentences, and a two-sentence piece), in alternating order
round by round, so that a noisy machine weighs on both alike. Per text:

- first audio: text handed over -> first audio piece ready (16 kHz float32): what a listener
  waits for. pyttsx3 renders the text whole; Piper yields each sentence as it is rendered.
- render: text handed over -> all of its audio ready; real-time factor = render / audio length.

Both synthesizers are built (and warmed up by their constructors) before timing; one more
untimed round warms the caches. Prints a markdown table (median, P95, max in ms) and writes
``--json`` with the machine, versions and every sample.

    python -m bench.tts --rounds 5 --piper-threads 1,2 --json bench-tts.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from assistant.config import ModelSettings
from assistant.modes.offline import stay_offline
from assistant.stages.tts import Synthesizer, TtsOptions
from bench.corpus import REPLY_PIECES as TEXTS
from store.bundled import ModelStore


def time_one(synth: object, text: str) -> dict[str, float]:
    """First audio and render time (ms) of ``text``, and the audio's length (ms)."""
    start = time.monotonic_ns()
    first_ns = 0
    samples = 0
    for piece in synth.stream(text):  # type: ignore[attr-defined]
        if not first_ns:
            first_ns = time.monotonic_ns()
        samples += piece.size
    done = time.monotonic_ns()
    return {
        "first_audio_ms": (first_ns - start) / 1e6,
        "render_ms": (done - start) / 1e6,
        "audio_ms": 1000 * samples / 16000,
    }


def summary(samples: list[dict[str, float]]) -> dict[str, float]:
    first = np.array([s["first_audio_ms"] for s in samples])
    render = np.array([s["render_ms"] for s in samples])
    audio = np.array([s["audio_ms"] for s in samples])
    return {
        "n": len(samples),
        "first_audio_median_ms": float(np.median(first)),
        "first_audio_p95_ms": float(np.percentile(first, 95)),
        "first_audio_max_ms": float(first.max()),
        "render_median_ms": float(np.median(render)),
        "audio_median_ms": float(np.median(audio)),
        "realtime_factor_median": float(np.median(render / audio)),
    }


def table(stats: dict[str, dict[str, float]]) -> str:
    lines = [
        "| engine | n | first audio median | P95 | max | render median | audio median | real-time factor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in stats.items():
        lines.append(
            f"| {name} | {s['n']} | {s['first_audio_median_ms']:.0f} | {s['first_audio_p95_ms']:.0f} | "
            f"{s['first_audio_max_ms']:.0f} | {s['render_median_ms']:.0f} | {s['audio_median_ms']:.0f} | "
            f"{s['realtime_factor_median']:.3f} |"
        )
    return "\n".join(lines)


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds over the texts (default 5)")
    parser.add_argument("--piper-threads", default="1", help="Piper's ONNX Runtime threads, e.g. 1,2")
    parser.add_argument("--piper-voice", default="en_US-joe-medium", help="store name or .onnx file")
    parser.add_argument("--store", type=Path, help="model store (default ~/.cache/assistant)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    stay_offline()  # as the app: ONNX Runtime's telemetry off before it is imported
    from assistant.stages.tts_piper import PiperSynthesizer

    store = ModelStore(args.store or ModelSettings().store_dir)
    engines: dict[str, object] = {"pyttsx3 (espeak-ng)": Synthesizer(TtsOptions(voice="en-us"))}
    for threads in (int(t) for t in args.piper_threads.split(",")):
        options = TtsOptions(engine="piper", piper_voice=args.piper_voice, threads=threads)
        engines[f"piper {Path(args.piper_voice).stem} ({threads} thread{'s' * (threads > 1)})"] = (
            PiperSynthesizer(options, store)
        )
    load_start = os.getloadavg()
    for text in TEXTS:  # untimed warm-up round
        for synth in engines.values():
            time_one(synth, text)
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in engines}
    names = list(engines)
    for r in range(args.rounds):
        for i, text in enumerate(TEXTS):
            order = names if (r + i) % 2 == 0 else names[::-1]  # alternate who goes first
            for name in order:
                samples[name].append({"text": text, "round": r, **time_one(engines[name], text)})  # type: ignore[dict-item]
    for synth in engines.values():
        synth.close()  # type: ignore[attr-defined]
    stats = {name: summary(s) for name, s in samples.items()}
    print(f"{args.rounds} rounds x {len(TEXTS)} texts per engine; load average {load_start} at start")
    print(table(stats))
    if args.json:
        out = {
            "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "load_avg_at_start": load_start,
                "load_avg_at_end": os.getloadavg(),
            },
            "versions": {d: version(d) for d in ("piper-tts", "pyttsx3", "onnxruntime", "numpy")},
            "definitions": {
                "first_audio_ms": "text handed to the synthesizer -> first audio piece ready",
                "render_ms": "text handed to the synthesizer -> all of its audio ready",
            },
            "stats": stats,
            "samples": samples,
        }
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What makes the app's audio streams run late: xruns of its speaker and microphone under loads.

The app's own :class:`~assistant.stages.playback.Speaker` plays a tone and its
:class:`~assistant.stages.audio.Microphone` is read by a thread, as the capture path does, on
the private virtual PulseAudio; meanwhile one load runs in the same process:

- ``none``;
- ``python:N``: N threads running pure Python (they contend for the GIL);
- ``procs:N``: N processes doing the same (they contend for the cores only);
- ``numpy:N``: N threads multiplying matrices (the GIL released);
- ``hold:MS``: a thread that every 1.5 s runs a full garbage collection sized to hold the
  GIL about MS ms (what a full collection in the UI did).

A load may end with ``@MS``: the GIL switch interval for it (Python's default 5 ms; the UI
sets 0.2). Each load runs ``--seconds`` after the stream's start-up. Also how late the speaker's
callback stamped its blocks (``Speaker.far_end``, the echo canceller's reference) against the
same blocks back to back: median and worst, after the earliest (an xrun restarts the stream and
breaks the back-to-back count). Prints a markdown table and writes JSON (``--json``).

    VIRTUAL_AUDIO_RUNTIME=/tmp/pa-xruns python -m bench.xruns --json xruns.json
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from bench.echo_rig import private_audio
from bench.results import write_results

HOLDS = " ".join(f"hold:{ms}@0.2" for ms in (50, 150, 200, 300))
LOADS = f"none python:2@5 python:2@0.2 procs:2 numpy:2 {HOLDS}"
OBJECTS_PER_MS = 10_000  # objects a full collection walks in a ms (this machine; the holds are reported)


def _spin(stop: Any) -> None:  # a threading or a multiprocessing event
    x = 0
    while not stop.is_set():
        for i in range(10_000):
            x += i * i


def _multiply(stop: threading.Event) -> None:
    a = np.random.default_rng(0).standard_normal((300, 300)).astype(np.float32)
    while not stop.is_set():
        a @ a


def _hold(stop: threading.Event, ms: float, held: list[float]) -> None:
    heap: list[list[list[int]]] = [[[] for _ in range(10)] for _ in range(int(ms * OBJECTS_PER_MS / 11))]
    while not stop.wait(1.5):
        start = time.perf_counter()
        gc.collect()
        held.append(1000 * (time.perf_counter() - start))
    del heap


def stamp_lateness(blocks: list[tuple[np.ndarray, int]], rate_hz: int) -> dict[str, float]:
    """How much later than back to back each block was stamped: median and worst (ms)."""
    if len(blocks) < 2:
        return {"stamp_late_ms_median": float("nan"), "stamp_late_ms_max": float("nan")}
    played = np.cumsum([0] + [block.shape[0] for block, _ in blocks[:-1]]) * 1e9 / rate_hz
    offsets = np.array([t_ns for _, t_ns in blocks]) - blocks[0][1] - played
    late = (offsets - offsets.min()) / 1e6
    return {"stamp_late_ms_median": float(np.median(late)), "stamp_late_ms_max": float(late.max())}


def run(load: str, seconds: float) -> dict:
    """One load: the streams' xruns, the microphone blocks' largest gap, the GIL holds."""
    from assistant.config.sections import AudioOptions
    from assistant.stages.audio import Microphone
    from assistant.stages.playback import Speaker

    kind, _, rest = load.partition(":")
    amount, _, switch = rest.partition("@")
    default = sys.getswitchinterval()
    sys.setswitchinterval(float(switch) / 1000 if switch else 0.005)
    speaker, mic = Speaker(AudioOptions()), Microphone(AudioOptions())
    speaker.far_end = deque(maxlen=2000)  # as in full duplex: each block is kept for the canceller
    mic.start()
    stop, stop_procs = threading.Event(), multiprocessing.Event()
    gaps: list[int] = []
    held: list[float] = []

    def read() -> None:
        last = 0
        while not stop.is_set():
            got = mic.read(0.1)
            if got is not None:
                gaps.append(got[1] - last if last else 0)
                last = got[1]

    threads = [threading.Thread(target=read, daemon=True)]
    procs: list[multiprocessing.Process] = []
    if kind == "python":
        threads += [threading.Thread(target=_spin, args=(stop,), daemon=True) for _ in range(int(amount))]
    elif kind == "numpy":
        threads += [threading.Thread(target=_multiply, args=(stop,), daemon=True) for _ in range(int(amount))]
    elif kind == "procs":
        procs = [multiprocessing.Process(target=_spin, args=(stop_procs,)) for _ in range(int(amount))]
    elif kind == "hold":
        threads.append(threading.Thread(target=_hold, args=(stop, float(amount), held), daemon=True))
    tone = 0.1 * np.sin(np.arange(16_000 * int(seconds + 5)) * 2 * np.pi * 440 / 16_000)
    time.sleep(3)  # a stream on a PulseAudio just started settles first
    xruns = speaker.xruns, mic.xruns
    speaker.far_end.clear()
    for thread in threads:
        thread.start()
    for proc in procs:
        proc.start()
    for k in range(0, tone.size, 16_000):
        speaker.play(1, tone[k : k + 16_000].astype(np.float32))
    time.sleep(seconds)
    row = {
        "load": load,
        "switch_interval_ms": sys.getswitchinterval() * 1000,
        "speaker_xruns": speaker.xruns - xruns[0],
        "microphone_xruns": mic.xruns - xruns[1],
        "mic_gap_max_ms": max(gaps[5:], default=0) / 1e6,
        "gil_held_ms": [round(h) for h in held],
        **stamp_lateness(list(speaker.far_end), speaker.rate_hz),
        "output_latency_ms": speaker.output_latency_ms,
    }
    stop.set()
    stop_procs.set()
    for proc in procs:
        proc.join()
    speaker.close()
    mic.close()
    sys.setswitchinterval(default)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", default=LOADS, help="space-separated (see the module's docstring)")
    parser.add_argument("--seconds", type=float, default=20.0, help="per load")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    with private_audio("bench-xruns-") as env:
        os.environ.update(env)  # before PortAudio starts (on the first load)
        for load in args.loads.split():
            rows.append(run(load, args.seconds))
            print(rows[-1], flush=True)
    print(f"\n{args.seconds:g} s a load, output latency {rows[0]['output_latency_ms']:.0f} ms")
    print(
        "| load | switch interval | speaker xruns | microphone xruns | largest mic gap "
        "| speaker stamps late, median / worst | GIL held (each) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        held = ", ".join(map(str, r["gil_held_ms"])) + " ms" if r["gil_held_ms"] else ""
        print(
            f"| {r['load']} | {r['switch_interval_ms']:g} ms | {r['speaker_xruns']} | "
            f"{r['microphone_xruns']} | {r['mic_gap_max_ms']:.0f} ms | "
            f"{r['stamp_late_ms_median']:.1f} / {r['stamp_late_ms_max']:.1f} ms | {held} |"
        )
    if args.json:
        write_results(args.json, args, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

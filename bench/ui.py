"""What the terminal UI costs the decoder: typed turns with and without the Textual UI.

The same questions go through the pipeline alone (``VoicePipeline.run_text_turn``, events to
a list) and through the real UI driven by Textual's Pilot (headless, one session per mode),
once per GIL switch interval. Each mode builds a fresh session in this process. Prints a
table (TTFT, decode rate, first sentence: median and worst) and writes JSON.

It also counts what would stall an audio callback, which needs the GIL for each block: the
garbage collector's full (generation 2) collections, which hold it throughout, and the
longest lateness of a thread that sleeps 5 ms at a time (how long a callback could have
waited for the GIL, or for a core), over the turns of each row.

    python -m bench.ui --json docs/results/bench-ui-cpu.json
    python -m bench.ui --random-weights .devrun/smollm2-random --device cuda --dtype fp16

``--random-weights DIR`` fills a copy of DIR (a config and tokenizer, no weights) with random
weights of that shape, for machines without the model store; timing does not depend on them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from assistant.app import build_session
from assistant.config import load_settings
from assistant.modes.offline import stay_offline
from assistant.observe.latency import TurnRecord
from assistant.tui.app import UI_SWITCH_INTERVAL_S, AssistantApp
from bench.corpus import UI_QUESTIONS as QUESTIONS


def random_model(template: Path) -> Path:
    """A copy of ``template`` (config + tokenizer) with random weights of its shape."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(tempfile.mkdtemp(prefix="bench-ui-model-")) / template.name
    shutil.copytree(template, folder)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


class Stalls:
    """Garbage collections and a 5 ms sleeper's lateness while in the ``with`` block."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, ms)
        self.late_ms: list[float] = []
        self._start_ns = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sleeper, name="bench-sleeper", daemon=True)

    def _collecting(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start_ns = time.perf_counter_ns()
        else:
            self.pauses.append((info["generation"], (time.perf_counter_ns() - self._start_ns) / 1e6))

    def _sleeper(self) -> None:
        last = time.perf_counter()
        while not self._done.wait(0.005):
            now = time.perf_counter()
            self.late_ms.append(1000 * (now - last - 0.005))
            last = now

    def __enter__(self) -> Stalls:
        gc.callbacks.append(self._collecting)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._done.set()
        self._thread.join()
        gc.callbacks.remove(self._collecting)

    def summary(self) -> dict[str, float]:
        full = [ms for gen, ms in self.pauses if gen == 2]
        late = np.array(self.late_ms or [0.0])
        return {
            "gc_full_collections": len(full),
            "gc_full_ms_median": float(np.median(full)) if full else float("nan"),
            "gc_ms_max": max((ms for _, ms in self.pauses), default=0.0),
            "late_ms_max": float(late.max()),
            "late_over_30ms": int((late > 30).sum()),
        }


def pipeline_only(settings, turns: int, stalls: Stalls) -> list[TurnRecord]:
    events: list[object] = []
    session = build_session(settings, devices=False, emit=events.append)
    try:
        with stalls:
            return [
                session.pipeline.run_text_turn(i, QUESTIONS[i % len(QUESTIONS)], None, threading.Event())
                for i in range(1, turns + 1)
            ]
    finally:
        session.close()


async def through_ui(settings, turns: int, size: tuple[int, int], stalls: Stalls) -> list[TurnRecord]:
    def build(emit, progress, cancel):
        return build_session(settings, devices=False, emit=emit, progress=progress, cancel=cancel)

    app = AssistantApp(build, settings=settings, gpu=True)
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + 600
        while app.session is None:
            assert time.monotonic() < deadline, "the session did not load"
            await pilot.pause(0.2)
        with stalls:
            for i in range(turns):
                await pilot.press("t", *QUESTIONS[i % len(QUESTIONS)])
                await pilot.pause(1.0)  # typed, then a pause before Enter, as a person would
                await pilot.press("enter")
                while len(app.records) <= i:
                    assert time.monotonic() < deadline, "no reply"
                    await pilot.pause(0.05)
        await pilot.press("q")
    return app.records


def summary(records: list[TurnRecord], stalls: Stalls) -> dict[str, float]:
    def col(key: str) -> np.ndarray:
        return np.array([r.metrics[key] for r in records if r.metrics.get(key) is not None])

    ttft, rate, first = col("ttft_ms"), col("tokens_per_s"), col("first_sentence_ms")
    return {
        "turns": len(records),
        "ttft_ms_median": float(np.median(ttft)),
        "ttft_ms_max": float(ttft.max()),
        "tokens_per_s_median": float(np.median(rate)),
        "tokens_per_s_min": float(rate.min()),
        "first_sentence_ms_median": float(np.median(first)) if first.size else float("nan"),
        **stalls.summary(),
    }


def main(argv: list[str] | None = None) -> int:
    stay_offline()  # no telemetry from ONNX Runtime, no hub lookups (assistant/modes/offline.py)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="store name or folder")
    parser.add_argument("--random-weights", type=Path, metavar="DIR", help="config + tokenizer folder")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument(
        "--switch-intervals", default=f"0.005,{UI_SWITCH_INTERVAL_S}", help="seconds, comma-separated"
    )
    parser.add_argument("--size", default="160x40", help="terminal size of the UI")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    model = str(random_model(args.random_weights)) if args.random_weights else args.model
    settings = load_settings(
        None,
        overrides={
            "models.llm": model,
            "decoder.device": args.device,
            "decoder.dtype": args.dtype,
            "generation.max_new_tokens": args.max_new_tokens,
        },
    )
    width, height = (int(v) for v in args.size.split("x"))
    default = sys.getswitchinterval()
    stalls = Stalls()
    rows = {"pipeline only, no UI": summary(pipeline_only(settings, args.turns, stalls), stalls)}
    backend = ""
    for interval in (float(v) for v in args.switch_intervals.split(",")):
        sys.setswitchinterval(interval)
        stalls = Stalls()
        try:
            records = asyncio.run(through_ui(settings, args.turns, (width, height), stalls))
        finally:
            sys.setswitchinterval(default)
        backend = records[0].backend if records else backend
        rows[f"UI {width}x{height}, GIL switch interval {interval * 1e3:g} ms"] = summary(records, stalls)
    print(f"\nmodel {model}, backend {backend or '?'}, {args.turns} typed turns per row")
    print(
        "| run | TTFT median | TTFT max | tok/s median | tok/s min | first sentence median "
        "| full GCs | full GC median | longest GC | longest wait of a 5 ms sleeper | waits > 30 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['ttft_ms_median']:.1f} ms | {r['ttft_ms_max']:.1f} ms | "
            f"{r['tokens_per_s_median']:.0f} | {r['tokens_per_s_min']:.0f} | "
            f"{r['first_sentence_ms_median']:.0f} ms | {r['gc_full_collections']} | "
            f"{r['gc_full_ms_median']:.1f} ms | {r['gc_ms_max']:.1f} ms | {r['late_ms_max']:.1f} ms | "
            f"{r['late_over_30ms']} |"
        )
    if args.json:
        out = {
            "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "model": f"random weights, shape of {args.random_weights.name}" if args.random_weights else model,
            "backend": backend,
            "rows": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

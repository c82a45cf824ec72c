"""Time the decoder backends side by side: TTFT, decode ms/token, voice-turn requests/s, memory.

One process, one model folder, batch 1, greedy, one backend (table row) after the other; each
row is built, measured, then freed, so its peak GPU memory is its own. Clocks are
``time.monotonic_ns`` (the clock of ``GenerationStats``); every stop reads a token id on the
host, which waits for the device, so no extra synchronisation is needed. EOS is ignored, so
every request produces exactly the tokens asked for (the work per step does not depend on ids).

TTFT @ N tokens (a prompt of exactly N ids: repeated English text, or seeded random ids with
random weights); ``--warmup`` runs dropped, then median and P99 (linear interpolation; with 20
runs P99 is near the maximum) of ``--runs``.
    ours: ``driver.reset()``, then one ``driver.generate(ids, max_new_tokens=1)``;
          ``stats.ttft_ms``: submitted -> first token id on the host (prefill and choice).
    transformers: start just before ``model.generate(ids, max_new_tokens=1, do_sample=False)``,
          stop when its streamer receives the first new id (generate's set-up counts).
Decode ms/token: one request of ``--decode-tokens`` + 1 new tokens after a
``--decode-prompt-length`` prompt; (stamp of the last token - stamp of the first) / decode
tokens; median over ``--decode-runs`` runs after one warm-up. Decode step P50 / P95: over
every single token interval of those runs. A step is the one-token forward,
the token choice and the driver's loop (streaming text, stop checks): what a user gets.
Turn: ``--turns`` sequential requests of a typical voice turn (``--turn-prompt`` prompt,
``--turn-reply`` reply tokens), each from an empty cache, after two warm-up requests;
requests/s = turns / wall time of all of them.
Peak GPU memory: ``torch.cuda.max_memory_allocated`` from building the row to its end
(weights, KV cache, graphs' pools, activations).
Weight-bandwidth floor: the bytes a decode step must read (every weight once) over the copy
bandwidth measured on the device at the start of this run (bytes read + written).
Profile (CUDA rows, ``--profile-steps``): torch.profiler over that many decode steps through
the driver: device ops and device busy time per token; CUDA-graph rows also time bare replays
of the decode graph of every KV window with CUDA events (the decode above runs in the first).
Second turn of a real chat (real models only, not with random weights): ``Dialogue``, default
system prompt; turn 1 "What is the capital of France?", then the timed turn 2 "And what is it
famous for?" with the cache kept (prefix reuse) or after ``driver.reset()`` (full re-prefill).

``--smoke``: seeded random weights of a tiny Llama (2 layers, hidden 64), a few runs of
transformers, ours eager and the graph step without capture (``static-fp32``) on the CPU:
seconds, so CI keeps this script working.
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from time import monotonic_ns as now
from typing import Any

import numpy as np
import torch

from assistant.config import DEFAULT_SYSTEM_PROMPT, ModelSettings
from assistant.modes.offline import stay_offline
from bench.backends import (
    AUTO_CPU,
    AUTO_CUDA,
    BACKENDS,
    SHAPES,
    SMOKE,
    Context,
    DriverRunner,
    NoTokenizer,
    Runner,
    unavailable,
    write_random_model,
)
from bench.corpus import TURN1, TURN2
from bench.report import copy_bandwidth_gbps, machine, render, weight_floor
from engines.base import GenerationOptions
from engines.cuda_graph import CudaGraphStep
from engines.torch_backend import configure_threads
from models.config import DecoderConfig
from store.bundled import DEFAULT_LLM, ModelStore

FILLER = (
    "The old lighthouse keeper climbed the stairs every evening to light the lamp. Ships passed "
    "the rocky coast in the dark, and their crews were grateful for the steady beam of light. "
)


def summary(samples: list[float]) -> dict[str, Any]:
    rounded = [round(s, 4) for s in samples]
    return {
        "median": float(np.median(samples)),
        "p95": float(np.percentile(samples, 95)),
        "p99": float(np.percentile(samples, 99)),
        "samples": rounded,
    }


@dataclass
class Bench:
    args: argparse.Namespace
    tokenizer: Any  # None with random weights
    vocab: int
    chat_ids: list[int] | None = None  # the turn-2 prompt our first backend built

    def prompt(self, n: int) -> list[int]:
        """Exactly ``n`` ids: repeated English text (seeded random ids with random weights)."""
        if self.tokenizer is None:
            return [int(i) for i in np.random.default_rng(n).integers(1, self.vocab, n)]
        base = self.tokenizer.encode(FILLER, add_special_tokens=False)
        return (base * (n // len(base) + 1))[:n]

    def measure(self, runner: Runner) -> dict[str, Any]:
        a = self.args
        row: dict[str, Any] = {"ttft": {}, "first_tokens": {}}
        for n in a.prompt_lengths:
            ids, kept = self.prompt(n), []
            for i in range(a.warmup + a.runs):
                t = runner.generate(ids, 1)
                if i >= a.warmup:
                    kept.append((t.token_ns[0] - t.t_submit_ns) / 1e6)
            row["ttft"][str(n)], row["first_tokens"][str(n)] = summary(kept), t.token_ids[0]
        ids, k, per_token, gaps = self.prompt(a.decode_prompt_length), a.decode_tokens, [], []
        for i in range(1 + a.decode_runs):
            t = runner.generate(ids, k + 1)
            if i >= 1:
                per_token.append((t.token_ns[k] - t.token_ns[0]) / 1e6 / k)
                gaps += [(b - e) / 1e6 for e, b in zip(t.token_ns[:k], t.token_ns[1 : k + 1], strict=True)]
        row["decode"], row["greedy_tokens"] = summary(per_token), t.token_ids[:16]
        row["decode_steps"] = {k: v for k, v in summary(gaps).items() if k != "samples"}
        ids = self.prompt(a.turn_prompt)
        for _ in range(2):
            runner.generate(ids, a.turn_reply)
        t0 = now()
        turns = [runner.generate(ids, a.turn_reply) for _ in range(a.turns)]
        wall_s = (now() - t0) / 1e9
        row["turn"] = {
            "requests_per_s": a.turns / wall_s,
            **summary([(t.t_done_ns - t.t_submit_ns) / 1e6 for t in turns]),
        }
        return row


def profile_decode(runner: DriverRunner, ids: list[int], steps: int) -> dict[str, Any]:
    """Device ops and busy time per decode step through the driver; bare graph replays too."""
    from torch.profiler import ProfilerActivity, profile

    d = runner.driver
    d.reset()
    first, following = d.choosers(GenerationOptions(), [])
    token = first(ids)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            token = following(token)
        torch.cuda.synchronize()
    device_ops = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = {e.key: getattr(e, "self_device_time_total", 0.0) / 1e3 / steps for e in device_ops}
    out: dict[str, Any] = {
        "steps": steps,
        "device_ops_per_token": sum(e.count for e in device_ops) / steps,
        "device_busy_ms_per_token": sum(busy.values()),
        "top": sorted(busy.items(), key=lambda kv: -kv[1])[:4],
    }
    if isinstance(d.step, CudaGraphStep):
        by_window = {w: replay_ms(d.step.decodes[w], steps) for w in d.step.windows}
        out["window"] = d.step.window_for(len(ids))
        out["replay_ms"] = by_window[out["window"]]
        out["replay_ms_by_window"] = {str(w): ms for w, ms in by_window.items()}
    d.reset()
    return out


def replay_ms(replay: Any, steps: int) -> float:
    """Mean ms of ``steps`` back-to-back replays of one decode graph (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replay()
    start.record()
    for _ in range(steps):
        replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def chat_turn2(driver: Any, tokenizer: Any, reuse: bool) -> tuple[float, list[int], str]:
    from assistant.stages.dialogue import Dialogue

    driver.reset()
    dialogue = Dialogue(driver, tokenizer, DEFAULT_SYSTEM_PROMPT, GenerationOptions(max_new_tokens=32))
    for _ in dialogue.ask(TURN1):
        pass
    if not reuse:
        driver.reset()
    reply = dialogue.ask(TURN2)
    for _ in reply:
        pass
    s = reply.stats
    return s.ttft_ms or 0.0, reply.plan.ids, f"{s.prefilled_tokens} prefilled + {s.reused_tokens} reused"


def chat(bench: Bench, runner: Runner) -> dict[str, Any]:
    """Turn-2 TTFT of a real chat; transformers gets the same turn-2 ids (no cache across calls)."""
    runs = range(1 + bench.args.runs)  # the first is a warm-up
    if isinstance(runner, DriverRunner):
        got = {
            mode: [chat_turn2(runner.driver, bench.tokenizer, mode) for _ in runs] for mode in (True, False)
        }
        reuse, full = ([ms for ms, _, _ in got[mode][1:]] for mode in (True, False))
        bench.chat_ids = bench.chat_ids or got[True][0][1]
        tokens = f"reuse: {got[True][0][2]}; full: {got[False][0][2]}"
        return {"reuse_ms": float(np.median(reuse)), "full_ms": float(np.median(full)), "tokens": tokens}
    if bench.chat_ids is None:  # no driver row ran before this one
        return {}
    ids = bench.chat_ids
    full = [(t.token_ns[0] - t.t_submit_ns) / 1e6 for t in (runner.generate(ids, 1) for _ in runs)][1:]
    return {"full_ms": float(np.median(full)), "tokens": f"{len(ids)} prefilled (our turn-2 prompt)"}


def run_row(key: str, ctx: Context, bench: Bench) -> dict[str, Any]:
    """Build backend ``key``, measure it, free it; errors become the row's ``error``."""
    a, cuda = bench.args, ctx.device.type == "cuda"
    row: dict[str, Any] = {"key": key, "name": key, "describe": BACKENDS[key].describe}
    print(f"[bench] {key}: building", file=sys.stderr, flush=True)
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        t0 = now()
        runner: Runner | None = BACKENDS[key].build(ctx)
        assert runner is not None
        row |= {"name": runner.name, "build_s": (now() - t0) / 1e9}
        print(
            f"[bench] {key}: {runner.name} built in {row['build_s']:.1f} s; measuring",
            file=sys.stderr,
            flush=True,
        )
        row |= bench.measure(runner)
        if cuda and a.profile_steps and isinstance(runner, DriverRunner) and not BACKENDS[key].cpu_only:
            row["profile"] = profile_decode(runner, bench.prompt(a.decode_prompt_length), a.profile_steps)
        if bench.tokenizer is not None:
            row["chat"] = chat(bench, runner)
        if cuda and not BACKENDS[key].cpu_only:
            row["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    except Exception as e:  # one broken backend must not hide the others' numbers
        row["error"] = f"{type(e).__name__}: {e}"
        print(f"[bench] {key}: FAILED {row['error']}", file=sys.stderr, flush=True)
    finally:
        runner = None
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.decoder",
        description=__doc__.split("\n\n")[0],
        epilog="Metric definitions: see this script's docstring.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    store_path = ModelStore(ModelSettings().store_dir).path(DEFAULT_LLM)
    p.add_argument("--model-dir", type=Path, default=store_path, help="safetensors folder (docs/models.md)")
    p.add_argument("--random-weights", action="store_true", help="time seeded random weights of --shape")
    p.add_argument("--shape", choices=sorted(SHAPES), help="model shape for --random-weights")
    keys = ", ".join(BACKENDS)
    p.add_argument("--backends", default="auto", help=f"comma-separated rows ({keys}) or auto")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--prompt-lengths", default="32,128,512", help="TTFT prompt lengths in tokens")
    p.add_argument("--runs", type=int, default=20, help="timed TTFT runs per length (and chat turns)")
    p.add_argument("--warmup", type=int, default=3, help="untimed TTFT runs before the timed ones")
    p.add_argument("--decode-tokens", type=int, default=128, help="decode steps timed per run")
    p.add_argument("--decode-prompt-length", type=int, default=128, help="prompt tokens before decoding")
    p.add_argument("--decode-runs", type=int, default=3, help="timed decode runs (after one warm-up)")
    p.add_argument("--turns", type=int, default=10, help="sequential voice-turn requests timed")
    p.add_argument("--turn-prompt", type=int, default=128, help="voice-turn prompt tokens")
    p.add_argument("--turn-reply", type=int, default=32, help="voice-turn reply tokens")
    p.add_argument("--capacity-tokens", type=int, default=2048, help="KV cache of our backends")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: min(cores, 4))")
    p.add_argument(
        "--profile-steps", type=int, default=32, help="profiled decode steps per CUDA row (0: off)"
    )
    p.add_argument("--json", type=Path, default=Path("bench-decoder.json"), help="results; .md beside it")
    p.add_argument("--smoke", action="store_true", help="tiny random model, CPU rows, few runs (for CI)")
    args = p.parse_args(argv)
    try:
        args.prompt_lengths = [int(s) for s in args.prompt_lengths.split(",") if s.strip()]
    except ValueError:
        p.error(f"--prompt-lengths: expected integers like 32,128,512, got {args.prompt_lengths!r}")
    if args.smoke:
        args.random_weights, args.shape = True, "tiny"
        args.runs, args.warmup, args.decode_tokens, args.decode_runs = 2, 1, 8, 1
        args.turns, args.turn_prompt, args.turn_reply, args.profile_steps = 2, 16, 4, 0
    if args.shape and not args.random_weights:
        p.error("--shape times random weights: add --random-weights (real weights come from --model-dir)")
    if args.random_weights and not args.shape:
        p.error("--random-weights needs --shape")
    counts = [*args.prompt_lengths, args.decode_tokens, args.decode_prompt_length, args.runs, args.turns]
    counts += [args.decode_runs, args.turn_prompt, args.turn_reply]
    if not args.prompt_lengths or min(counts) < 1 or min(args.warmup, args.threads, args.profile_steps) < 0:
        p.error("lengths, token counts, runs and turns must be >= 1; --warmup, --threads >= 0")
    return args


def backend_keys(args: argparse.Namespace, device: torch.device) -> list[str]:
    if args.backends == "auto":
        return list(SMOKE if args.smoke else AUTO_CUDA if device.type == "cuda" else AUTO_CPU)
    keys = [k.strip() for k in args.backends.split(",") if k.strip()]
    unknown = [k for k in keys if k not in BACKENDS]
    if unknown:
        sys.exit(f"unknown backends {unknown}; choose from {', '.join(BACKENDS)}")
    return keys


def load(args: argparse.Namespace, tmp: Path, device: torch.device) -> tuple[Path, str, Any]:
    """The model folder, its description and its tokenizer (None with random weights)."""
    if args.random_weights:
        write_random_model(args.shape, tmp, device)
        return (
            tmp,
            f"RANDOM WEIGHTS of the {args.shape} shape (seed 0): timings only, tokens meaningless",
            None,
        )
    if not (args.model_dir / "config.json").is_file():
        sys.exit(f"no model at {args.model_dir}: run 'assistant models fetch' or pass --model-dir")
    from assistant.stages.tokenizer import load_tokenizer

    return args.model_dir, str(args.model_dir), load_tokenizer(args.model_dir)


def agreement(rows: list[dict[str, Any]]) -> list[str]:
    """How many leading greedy decode tokens each row shares with transformers (or the first row)."""
    done = [r for r in rows if "greedy_tokens" in r]
    if len(done) < 2:
        return []
    ref = next((r for r in done if r["key"] == "transformers"), done[0])
    parts = []
    for r in (r for r in done if r is not ref):
        same = next(
            (
                i
                for i, (x, y) in enumerate(zip(r["greedy_tokens"], ref["greedy_tokens"], strict=False))
                if x != y
            ),
            16,
        )
        parts.append(f"{r['key']} {same}/16")
    return [f"greedy decode tokens identical to {ref['key']} (leading, of 16): " + ", ".join(parts)]


def main(argv: list[str] | None = None) -> int:
    stay_offline()  # no telemetry from ONNX Runtime, no hub lookups (assistant/modes/offline.py)
    args = parse_args(argv)
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else "cpu"
        if args.device == "auto"
        else args.device
    )
    configure_threads(args.threads)
    threads = torch.get_num_threads()
    keys = backend_keys(args, device)
    with tempfile.TemporaryDirectory(prefix="bench-decoder-") as tmp:
        model_dir, label, tokenizer = load(args, Path(tmp), device)
        config = DecoderConfig.from_dir(model_dir)
        needed = max(
            *args.prompt_lengths,
            args.decode_prompt_length + args.decode_tokens + 1,
            args.turn_prompt + args.turn_reply,
        )
        if needed > config.max_position_embeddings:
            sys.exit(f"{needed} tokens needed; the model allows {config.max_position_embeddings}")
        size_mib = 1024 if device.type == "cuda" else 16 if args.smoke else 256
        floor = weight_floor(config, copy_bandwidth_gbps(device, size_mib))
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        doc: dict[str, Any] = {
            "machine": machine(device, threads),
            "model": label,
            "random_weights": bool(args.random_weights),
            "shape": args.shape,
            "command": shlex.join(sys.orig_argv),
            "settings": settings,
            "floor": floor,
            "rows": [],
            "notes": [],
        }
        ctx = Context(
            model_dir, tokenizer or NoTokenizer(), device, max(needed, args.capacity_tokens), threads
        )
        bench = Bench(args, tokenizer, config.vocab_size)
        for key in keys:
            reason = unavailable(key, device)
            if reason:
                doc["notes"].append(reason)
                continue
            doc["rows"].append(run_row(key, ctx, bench))
            args.json.write_text(json.dumps(doc, indent=2) + "\n")  # a killed run keeps finished rows
    doc["notes"] += agreement(doc["rows"])
    report = render(doc)
    print(report)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    args.json.with_suffix(".md").write_text(report + "\n")
    print(f"\nwrote {args.json} and {args.json.with_suffix('.md')}")
    return 1 if any("error" in r for r in doc["rows"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())

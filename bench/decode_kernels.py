"""Time each Triton decode kernel (engines/decode_kernels.py) at a model's shapes, per tile.

Each variant is launched 100 times back to back inside one CUDA graph (as the decode graph
runs them), replayed 20 times after a warm-up; the median replay / 100 is its time per launch.
Prints, per product, the best tile (rows, columns, warps) with its µs and effective GB/s
(weight bytes / time), and the default rule's tile beside it. fp16, random data.

    python -m bench.decode_kernels --shape smollm2-135m --json kernels.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.backends import SHAPES

LAUNCHES = 100


def time_us(launch: Any) -> float:
    launch()  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCHES):
            launch()
    graph.replay()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / LAUNCHES)
    return float(np.median(times))


def main(argv: list[str] | None = None) -> int:
    from engines import decode_kernels as k

    p = argparse.ArgumentParser(prog="python -m bench.decode_kernels", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--window", type=int, default=256, help="attention: KV window (slots)")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    hf = SHAPES[a.shape]
    hidden, inner, vocab = hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    heads, kv_heads = hf["num_attention_heads"], hf["num_key_value_heads"]
    d = hf.get("head_dim", hidden // heads)
    dev, dt = torch.device("cuda"), torch.float16
    torch.manual_seed(0)
    x = torch.randn(max(hidden, inner, heads * d), device=dev, dtype=dt)
    norm = torch.rand(hidden, device=dev, dtype=dt) + 0.5
    splits = max(1, min(8, a.window // 64))
    part_m = torch.randn(8, heads, device=dev)
    part_l = torch.rand(8, heads, device=dev) + 1
    part_acc = torch.randn(8, heads * d, device=dev)
    products: dict[str, tuple[int, int, torch.Tensor, dict[str, Any]]] = {  # rows, columns, input, kwargs
        "qkv (norm)": ((heads + 2 * kv_heads) * d, hidden, x[:hidden], {"norm": (norm, 1e-5)}),
        "o (combine, residual)": (
            hidden, heads * d, x[: heads * d],
            {"splits": (part_m, part_l, part_acc, splits, heads), "residual": True},
        ),
        "gate/up (norm, gated)": (inner, hidden, x[:hidden], {"norm": (norm, 1e-5), "gated": True}),
        "down (residual)": (hidden, inner, x[:inner], {"residual": True}),
        "LM head (norm)": (vocab, hidden, x[:hidden], {"norm": (norm, 1e-5)}),
    }  # fmt: skip
    out: dict[str, Any] = {"shape": a.shape, "window": a.window, "products": {}}
    bandwidth_note = []
    for name, (n, kk, vec, kw) in products.items():
        w = torch.randn(n * (2 if kw.get("gated") else 1), kk, device=dev, dtype=dt) * 0.02
        y = torch.zeros(n, device=dev, dtype=torch.float32 if name.startswith("LM") else dt)
        results = []
        for rows, cols, warps in itertools.product((1, 2, 4, 8), (256, 512), (2, 4)):
            us = time_us(lambda: k.gemv(vec, w, y, tile=(rows, cols, warps), **kw))  # noqa: B023
            results.append(((rows, cols, warps), us))
        default_us = time_us(lambda: k.gemv(vec, w, y, **kw))  # noqa: B023
        best, best_us = min(results, key=lambda r: r[1])
        gbps = w.numel() * 2 / (best_us * 1e-6) / 1e9
        out["products"][name] = {
            "rows": n, "cols": kk, "best_tile": best, "best_us": best_us, "default_us": default_us,
            "best_gbps": gbps, "all": [[list(t), u] for t, u in results],
        }  # fmt: skip
        bandwidth_note.append(f"{name:24s} {n:6d}x{kk:<5d} best {best} {best_us:6.2f} us ({gbps:5.0f} GB/s), "
                              f"default {default_us:6.2f} us")  # fmt: skip
    qkv = torch.randn((heads + 2 * kv_heads) * d, device=dev, dtype=dt)
    cache = torch.randn(1, kv_heads, 2048, d, device=dev, dtype=dt)
    values = cache.clone()
    cos, sin = torch.rand(2048, d, device=dev, dtype=dt), torch.rand(2048, d, device=dev, dtype=dt)
    pos = torch.tensor([a.window - 3], device=dev)
    for block in (32, 64, 128):
        for sp in sorted({1, 2, 4, splits, 8}):
            us = time_us(lambda: k.attention(  # noqa: B023
                qkv, cos, sin, pos, cache, values, (part_m, part_l, part_acc), heads=heads,
                kv_heads=kv_heads, scale=d**-0.5, window=a.window, splits=sp, block_slots=block,  # noqa: B023
            ))  # fmt: skip
            out.setdefault("attention", []).append({"block_slots": block, "splits": sp, "us": us})
            bandwidth_note.append(f"attention window {a.window} block {block} splits {sp}: {us:6.2f} us")
    print("\n".join(bandwidth_note))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

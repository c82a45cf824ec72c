"""Time the turn-taking stages a GPU machine runs, for a stage-by-stage voice-to-voice estimate.

What it times, each a median and P95 of ``--runs`` after warm-up:

- Smart Turn v3.2 (``assistant.stages.smart_turn``) on this machine's CPU with 1, 2 and 4 threads:
  features + inference of one score (the model ships as CPU int8 ONNX only).
- Whisper tiny.en's shape (transformers, seeded random weights from the published config,
  fp16 on CUDA when present): the encoder over a 30 s window plus 12 greedy decoder steps,
  i.e. a short question. An upper bound for ASR: faster-whisper (CTranslate2) is faster
  still, but has no build for a CUDA 13 machine.

The LLM stages come from ``python -m bench.decoder`` (TTFT and decode ms/token); the script
prints the commands. Prints a table and writes JSON.

    python -m bench.turn_gpu --turn-model PATH --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

TINY_EN: dict[str, Any] = {  # openai/whisper-tiny.en config.json
    "vocab_size": 51864,
    "num_mel_bins": 80,
    "d_model": 384,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "encoder_attention_heads": 6,
    "decoder_attention_heads": 6,
    "encoder_ffn_dim": 1536,
    "decoder_ffn_dim": 1536,
    "max_source_positions": 1500,
    "max_target_positions": 448,
    "decoder_start_token_id": 50257,
    "eos_token_id": 50256,
    "pad_token_id": 50256,
}


def timed(fn: Callable[[], object], runs: int, warmup: int, sync: Callable[[], None]) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(runs):
        t0 = time.monotonic_ns()
        fn()
        sync()
        samples.append((time.monotonic_ns() - t0) / 1e6)
    arr = np.asarray(samples)
    return {"median_ms": float(np.median(arr)), "p95_ms": float(np.percentile(arr, 95)), "n": runs}


def smart_turn(path: Path, runs: int) -> dict[str, dict[str, float]]:
    from assistant.stages.smart_turn import SmartTurn

    audio = np.random.default_rng(0).standard_normal(16000 * 3).astype(np.float32) * 0.1
    out = {}
    for threads in (1, 2, 4):
        model = SmartTurn(path, threads)
        out[f"smart turn, CPU, {threads} thread(s)"] = timed(
            lambda m=model: m.score(audio),  # type: ignore[misc]
            runs,
            5,
            lambda: None,
        )
    return out


def whisper(runs: int) -> dict[str, dict[str, float]]:
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    model: Any = WhisperForConditionalGeneration(WhisperConfig(**TINY_EN))
    model = model.to(device, dtype).eval()
    features = torch.randn(1, 80, 3000, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    @torch.inference_mode()
    def transcribe() -> object:
        return model.generate(features, max_new_tokens=12, min_new_tokens=12, do_sample=False)

    @torch.inference_mode()
    def encode() -> object:
        return model.model.encoder(features)

    where = f"{'CUDA fp16' if cuda else 'CPU fp32'}"
    return {
        f"whisper tiny.en shape, encoder, {where}": timed(encode, runs, 3, sync),
        f"whisper tiny.en shape, encoder + 12 tokens, {where}": timed(transcribe, runs, 3, sync),
    }


def main(argv: list[str] | None = None) -> int:
    from assistant.modes.offline import stay_offline

    stay_offline()  # no telemetry from ONNX Runtime, no hub lookups (assistant/modes/offline.py)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turn-model", type=Path, required=True, help="smart-turn-v3.2-cpu.onnx")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = {**smart_turn(args.turn_model, args.runs), **whisper(args.runs)}
    gpu = ""
    try:
        import torch

        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    except ImportError:
        pass
    print(f"{platform.node()} {platform.processor() or platform.machine()} GPU: {gpu or 'none'}")
    print("| stage | median ms | P95 ms | n |\n|---|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {row['median_ms']:.1f} | {row['p95_ms']:.1f} | {row['n']} |")
    if args.json:
        info = {"command": " ".join(sys.argv), "gpu": gpu, "platform": platform.platform()}
        args.json.write_text(json.dumps({**info, "stages": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python
"""The torch ASR's decode on CUDA: first calls (new decode lengths) against repeated ones.

Random weights of Whisper tiny.en's shape (what is timed does not depend on the values) and
the real tokenizer; one attention implementation a process (``--variant``), so that each
starts cold. Decodes exactly N tokens (the end token held off, the limit set to N): greedy
N=24 three times, the beam of 5 N=24 twice, then greedy N=48 twice (24 new lengths).

    python bench/asr_cold.py --tokenizer tokenizer.json --variant sdpa --json out.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

VARIANTS = ("sdpa", "eager", "sdpa-no-cudnn")


def main(argv: list[str] | None = None) -> int:
    """Time the calls of one variant; print and write JSON lines."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokenizer", type=Path, required=True, help="Whisper tiny.en tokenizer.json")
    parser.add_argument("--variant", choices=VARIANTS, default="sdpa")
    parser.add_argument("--json", type=Path, help="append one JSON line here")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)

    import torch
    from scripts.bench_turn_gpu import TINY_EN
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    import assistant.stages.asr_torch as asr_torch
    import assistant.stages.whisper_search as whisper_search
    from assistant.stages.asr import AsrOptions
    from store.bundled import ModelStore

    folder = Path(tempfile.mkdtemp())
    torch.manual_seed(0)
    WhisperForConditionalGeneration(WhisperConfig(**TINY_EN)).save_pretrained(folder)
    (folder / "tokenizer.json").write_bytes(args.tokenizer.read_bytes())
    asr = asr_torch.TorchTranscriber(
        AsrOptions(model=str(folder), device=args.device, backend="torch"), ModelStore(folder)
    )
    if args.variant == "eager":
        asr.model.set_attn_implementation("eager")
    if args.variant == "sdpa-no-cudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)

    def sync() -> None:
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    audio = np.random.default_rng(0).standard_normal(32000).astype(np.float32) * 0.1
    calls = []
    with torch.inference_mode():
        encoded = asr.model.model.encoder(asr.log_mel(audio)).last_hidden_state
        sync()
        for label, beam, n in [("greedy24", 1, 24)] * 3 + [("beam24", 5, 24)] * 2 + [("greedy48", 1, 48)] * 2:
            whisper_search.MAX_TOKENS = len(asr.search.prompt) + n + 1
            t0 = time.monotonic_ns()
            tokens, _ = asr.search.greedy(encoded, n) if beam == 1 else asr.search.beam(encoded, beam, n)
            sync()
            calls.append({"call": label, "ms": (time.monotonic_ns() - t0) / 1e6, "tokens": len(tokens)})
    row = {
        "variant": args.variant,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "calls": calls,
    }
    print(args.variant, " ".join(f"{c['call']} {c['ms']:.1f}" for c in calls), flush=True)
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

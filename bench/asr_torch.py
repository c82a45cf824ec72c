#!/usr/bin/env python
"""Time the PyTorch Whisper backend (assistant.stages.asr_torch) stage by stage on real WAVs.

For each WAV, after warm-up, ``--runs`` times each (medians and P95; CUDA synchronized
before every clock read): the whole ``transcribe`` as the app calls it (beam 5) and its
greedy ``quick`` form (partial transcripts); the log-mel
features; the encoder over the 30 s window the app uses; the encoder over a window trimmed
to the speech (rounded up to 1 s: Whisper was trained on 30 s windows, so the trimmed
transcript is printed beside the full one, as a check, not a switch the app has); the
greedy decode; and ms per decoded token.

    python bench/asr_torch.py --store DIR --wavs q1.wav,q2.wav --runs 20 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def timed(fn: Callable[[], Any], runs: int, sync: Callable[[], None]) -> dict[str, float]:
    """P50/P95 ms of ``runs`` calls (after one warm-up call)."""
    fn()
    sync()
    ms = []
    for _ in range(runs):
        t0 = time.monotonic_ns()
        fn()
        sync()
        ms.append((time.monotonic_ns() - t0) / 1e6)
    return {"p50": float(np.percentile(ms, 50)), "p95": float(np.percentile(ms, 95)), "n": runs}


def trimmed_encoder(asr: Any, features: Any, frames: int) -> Any:
    """Whisper's encoder over the first ``frames`` mel frames (positions cut to match)."""
    import torch.nn.functional as F

    enc = asr.model.model.encoder
    x = F.gelu(enc.conv1(features[..., :frames]))
    x = F.gelu(enc.conv2(x)).permute(0, 2, 1)
    x = x + enc.embed_positions.weight[: x.shape[1]]
    for layer in enc.layers:
        out = layer(x, None)
        x = out[0] if isinstance(out, tuple) else out  # a tuple in older transformers
    return enc.layer_norm(x)


def main(argv: list[str] | None = None) -> int:
    """Time every WAV; print a table; write JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", type=Path, required=True, help="model store holding whisper-tiny.en")
    parser.add_argument("--model", default="whisper-tiny.en")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--wavs", required=True, help="comma-separated WAVs")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    import torch

    from assistant.stages.asr import AsrOptions
    from assistant.stages.asr_torch import HOP, TorchTranscriber
    from assistant.stages.audio_file import load_wav
    from store.bundled import ModelStore

    asr = TorchTranscriber(
        AsrOptions(model=args.model, device=args.device, backend="torch"), ModelStore(args.store)
    )
    cuda = asr.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    print(f"{asr.description}, load {asr.load_ms:.0f} ms, warm-up {asr.warm_up():.0f} ms", flush=True)
    rows = []
    for wav in args.wavs.split(","):
        audio = load_wav(wav)
        frames = int(np.ceil(audio.size / HOP / 100) * 100)  # whole seconds of mel frames
        with torch.inference_mode():
            features = asr.log_mel(audio)
            full = asr.model.model.encoder(features).last_hidden_state
            short = trimmed_encoder(asr, features, frames)
            tokens, _ = asr.search.greedy(full)
            short_tokens, _ = asr.search.greedy(short)
            row: dict[str, Any] = {
                "wav": Path(wav).name,
                "audio_s": audio.size / 16000,
                "text": asr.tokenizer.decode(tokens).strip(),
                "text_trimmed_window": asr.tokenizer.decode(short_tokens).strip(),
                "tokens": len(tokens),
                "transcribe_ms": timed(lambda: asr.transcribe(audio), args.runs, sync),  # noqa: B023
                "transcribe_quick_ms": timed(lambda: asr.transcribe(audio, quick=True), args.runs, sync),  # noqa: B023
                "log_mel_ms": timed(lambda: asr.log_mel(audio), args.runs, sync),  # noqa: B023
                "encoder_30s_ms": timed(lambda: asr.model.model.encoder(features), args.runs, sync),  # noqa: B023
                "encoder_trimmed_ms": timed(lambda: trimmed_encoder(asr, features, frames), args.runs, sync),  # noqa: B023
                "decode_ms": timed(lambda: asr.search.greedy(full), args.runs, sync),  # noqa: B023
            }
        row["decode_ms_per_token"] = row["decode_ms"]["p50"] / (len(tokens) + 1)  # + the end token
        rows.append(row)
        print(
            f"{row['wav']} {row['audio_s']:.1f} s | transcribe {row['transcribe_ms']['p50']:.1f} "
            f"(p95 {row['transcribe_ms']['p95']:.1f}), greedy {row['transcribe_quick_ms']['p50']:.1f} | "
            f"mel {row['log_mel_ms']['p50']:.2f} | encoder 30 s "
            f"{row['encoder_30s_ms']['p50']:.2f}, trimmed {row['encoder_trimmed_ms']['p50']:.2f} | decode "
            f"{row['decode_ms']['p50']:.1f} ({row['decode_ms_per_token']:.2f}/token) | {row['text']!r} | "
            f"trimmed: {row['text_trimmed_window']!r}",
            flush=True,
        )
    if args.json:
        info = {"command": " ".join(sys.argv), "asr": asr.description, "torch": torch.__version__}
        info["gpu"] = torch.cuda.get_device_name(0) if cuda else "none"
        args.json.write_text(json.dumps({**info, "wavs": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

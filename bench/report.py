"""Machine facts, the weight-bandwidth floor and the markdown report of ``bench/decoder.py``."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path
from time import monotonic_ns as now
from typing import Any

import torch

from models.config import DecoderConfig
from models.decoder import Decoder


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def machine(device: torch.device, threads: int) -> dict[str, Any]:
    """Where the numbers come from: CPU, GPU, driver and library versions."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")]
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": names[0] if names else platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": _version("transformers"),
        "onnxruntime": _version("onnxruntime"),
        "threads": threads,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "gpu": props.name,
            "gpu_sms": props.multi_processor_count,
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "gpu_driver": _driver_version(),
        }
    return info


def copy_bandwidth_gbps(device: torch.device, size_mib: int) -> float:
    """Measured copy bandwidth on ``device``, counting bytes read plus bytes written (GB/s)."""
    n = size_mib << 20
    src = torch.full((n,), 7, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    reps = 10
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        t0 = now()
        for _ in range(reps):
            dst.copy_(src)
        seconds = (now() - t0) / 1e9
    return 2 * n * reps / seconds / 1e9


def weight_floor(config: DecoderConfig, bandwidth_gbps: float) -> dict[str, Any]:
    """Bytes a decode step must read (each weight once) and the time that takes at ``bandwidth``.

    The embedding table counts only when tied to the LM head (then the head reads all of it);
    untied, a step reads one row of it.
    """
    with torch.device("meta"):
        model = Decoder(config)
    params = sum(p.numel() for p in model.parameters())  # tied tensors are listed once
    if not config.tie_word_embeddings:
        params -= model.embed_tokens.weight.numel()
    floor = {
        f"{name}_ms": params * size / (bandwidth_gbps * 1e9) * 1e3
        for name, size in (("fp16", 2), ("fp32", 4))
    }
    return {"weights_read_per_token": params, "copy_bandwidth_gbps": bandwidth_gbps, **floor}


def _ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.3f}" if v < 10 else f"{v:.1f}"


def _table(rows: list[dict[str, Any]], lengths: list[int]) -> list[str]:
    head = ["backend", *[f"TTFT@{n} p50 / p95 / p99 ms" for n in lengths]]
    head += ["decode ms/token", "step p50 / p95 ms", "× transformers/token", "turn req/s", "peak GPU MiB"]
    head += ["build s"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    base = next((r for r in rows if r["key"].startswith("transformers") and "decode" in r), None)
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error']} |" + " |" * (len(head) - 2))
            continue
        cells = [
            " / ".join(_ms(r["ttft"][str(n)].get(q, float("nan"))) for q in ("median", "p95", "p99"))
            for n in lengths
        ]
        decode = r["decode"]["median"]
        steps = r.get("decode_steps")
        ratio = f"{base['decode']['median'] / decode:.1f}×" if base else "—"
        mem = r.get("peak_gpu_mib")
        cells += [
            _ms(decode),
            f"{_ms(steps['median'])} / {_ms(steps['p95'])}" if steps else "—",
            ratio,
            f"{r['turn']['requests_per_s']:.1f}",
            "—" if mem is None else f"{mem:.0f}",
        ]
        cells.append(f"{r['build_s']:.1f}")
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return lines


def _profile_table(rows: list[dict[str, Any]]) -> list[str]:
    profiled = [r for r in rows if r.get("profile")]
    if not profiled:
        return []
    lines = [
        "",
        "Where a decode step's time goes (torch.profiler over the profiled steps; CUDA events for replays):",
        "",
        "| backend | device ops / token | GPU busy ms / token | decode ms / token (unprofiled) "
        "| graph replay ms | replay ms by KV window (slots) | top device ops (ms / token) |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in profiled:
        p = r["profile"]
        top = "; ".join(f"{name[:40]} {ms:.3f}" for name, ms in p["top"])
        replay = p.get("replay_ms")
        windows = ", ".join(f"{w}: {ms:.3f}" for w, ms in p.get("replay_ms_by_window", {}).items()) or "—"
        lines.append(
            f"| {r['name']} | {p['device_ops_per_token']:.0f} | {p['device_busy_ms_per_token']:.3f} | "
            f"{r['decode']['median']:.3f} | {'—' if replay is None else f'{replay:.3f}'} | "
            f"{windows} | {top} |"
        )
    return lines


def render(doc: dict[str, Any]) -> str:
    """The markdown report: setup, the table, the floor, notes."""
    m, s, f = doc["machine"], doc["settings"], doc["floor"]
    gpu = (
        f"{m['gpu']} ({m['gpu_sms']} SMs, {m['gpu_memory_gib']} GiB), driver {m['gpu_driver']}"
        if "gpu" in m
        else "no GPU"
    )
    lines = [
        "# Decoder benchmark",
        "",
        f"- GPU: {gpu}; torch {m['torch']} (CUDA {m['cuda']}), transformers {m['transformers']}, "
        f"onnxruntime {m['onnxruntime']}, python {m['python']}",
        f"- CPU: {m['cpu']}, {m['cpu_count']} cores, {m['threads']} torch threads; {m['platform']}",
        f"- model: {doc['model']}",
        f"- command: `{doc['command']}`",
        f"- batch 1, greedy, EOS ignored. TTFT: {s['runs']} runs after {s['warmup']} warm-up, "
        f"from submit to the first token id on the host. decode: {s['decode_tokens']} tokens after a "
        f"{s['decode_prompt_length']}-token prompt, median of {s['decode_runs']} runs. turn: "
        f"{s['turns']} sequential requests of {s['turn_prompt']} prompt + {s['turn_reply']} reply tokens.",
        f"- weight-bandwidth floor per decoded token: {f['weights_read_per_token'] / 1e6:.1f} M weights "
        f"read; copy bandwidth {f['copy_bandwidth_gbps']:.0f} GB/s (measured in this run) -> "
        f"fp16/bf16 {f['fp16_ms']:.3f} ms, fp32 {f['fp32_ms']:.3f} ms",
        "",
        *_table(doc["rows"], s["prompt_lengths"]),
        *_profile_table(doc["rows"]),
    ]
    chats = [r for r in doc["rows"] if r.get("chat")]
    if chats:
        lines += ["", "Second turn of a real chat (TTFT ms, median):", ""]
        lines += ["| backend | prefix reuse | full re-prefill | tokens |", "|---|---:|---:|---|"]
        for r in chats:
            c = r["chat"]
            lines.append(f"| {r['name']} | {_ms(c.get('reuse_ms'))} | {_ms(c['full_ms'])} | {c['tokens']} |")
    return "\n".join(lines + [""] + [f"- {n}" for n in doc["notes"]])

#!/usr/bin/env python
"""Benchmark our PyTorch decoder backend against Hugging Face transformers, side by side.

One process, one model folder, batch 1, greedy, CPU fp32, ``torch.set_num_threads(--threads)``
for both. Clocks are ``time.monotonic_ns`` (the clock of ``GenerationStats``).

TTFT @ N tokens (synthetic prompt of exactly N ids: repeated English text, sliced to N)
    ours:  ``driver.reset()`` (so all N tokens are prefilled), then start; ``driver.prefill(ids)``;
           stop once ``argmax`` of the returned host logits gives the first token id.
    transformers: start just before ``model.generate(ids, max_new_tokens=1, do_sample=False)``;
           stop when its streamer receives the first new token id (``generate`` calls
           ``streamer.put`` right after choosing the token, on the host). generate's own set-up
           counts (a caller pays it); its return path does not.
Decode ms/token (after a prompt of --decode-prompt-length ids, K = --decode-tokens steps)
    ours:  prefill, argmax, then start; K x ``token = argmax(driver.decode(token))``; stop after the
           K-th argmax; /K. EOS is ignored.
    transformers: one ``generate(max_new_tokens=K+1, min_new_tokens=K+1, do_sample=False)`` with a
           streamer stamping every new token id; (stamp of token K+1 - stamp of token 1) / K.
           min_new_tokens masks EOS, so ids may differ from ours; the work per step does not.
    On both sides a step is the one-token forward, logits -> token choice and loop bookkeeping.
Turn-2 TTFT of a real chat (``Dialogue``, default system prompt, greedy, max_new_tokens=32)
    Fresh dialogue each run; turn 1 "What is the capital of France?" runs to completion; then
    turn 2 "And what is it famous for?" either with the KV cache kept (prefix reuse: only tokens
    after the common prefix are prefilled) or after ``driver.reset()`` (full re-prefill).
    ``ttft``: ``reply.stats.ttft_ms`` (driver: prompt submitted -> first token id on host).
    ``ask -> first token``: start before ``dialogue.ask()``, so it also counts the chat-template
    render and tokenization. transformers (no cache across calls): the same turn-2 prompt ids
    through ``generate(max_new_tokens=1)``, timed as TTFT above. One untimed chat first fixes
    those ids; every later run checks that its turn-2 prompt is the same (greedy).

Statistics: ``--warmup`` runs are dropped, then median and P95 (linear interpolation: with few
runs it is near the max) of ``--runs``. Ours and transformers alternate within each run, so
background load hits both alike. ratio = how many times faster ours is (transformers ms / ours
ms; for tokens/s, ours / transformers).

``--smoke``: a tiny random-weight Llama (2 layers, hidden 64, 4 heads / 2 KV heads, vocab 256)
is saved as safetensors + config.json and loaded through ``load_torch_decoder``; only ours is
timed (no transformers, tokenizer or chat), 2 runs: seconds, so CI keeps this script working.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from time import monotonic_ns as now
from typing import Any

import numpy as np
import torch

from assistant.config import DEFAULT_SYSTEM_PROMPT, ModelSettings
from engines.base import GenerationOptions
from engines.torch_backend import TorchBackendOptions, load_torch_decoder
from models.config import DecoderConfig
from models.decoder import Decoder
from models.store import DEFAULT_LLM, ModelStore

FILLER = (
    "The old lighthouse keeper climbed the stairs every evening to light the lamp. Ships passed "
    "the rocky coast in the dark, and their crews were grateful for the steady beam of light. "
)
TURN1, TURN2 = "What is the capital of France?", "And what is it famous for?"
CHAT_OPTIONS = GenerationOptions(max_new_tokens=32)  # temperature 0: greedy
TINY = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128, eos_token_id=0)
TINY |= dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)


def summary(samples: list[float]) -> dict[str, Any]:
    rounded = [round(s, 3) for s in samples]
    return {"median": float(np.median(samples)), "p95": float(np.percentile(samples, 95)), "samples": rounded}


class Stamps:
    """A generate() streamer that records when each new token id reaches the host."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.t_ns: list[int] = []
        self.ids: list[int] = []

    def put(self, value: torch.Tensor) -> None:
        if self.prompt_seen:  # generate's first put is the prompt itself
            self.t_ns.append(now())
            self.ids.append(int(value.reshape(-1)[0]))
        self.prompt_seen = True

    def end(self) -> None:
        pass


def hf_generate(model: Any, ids: list[int], new_tokens: int) -> tuple[int, Stamps]:
    x, stamps = torch.tensor([ids], dtype=torch.long), Stamps()
    extra = {"do_sample": False, **({"min_new_tokens": new_tokens} if new_tokens > 1 else {})}
    t0 = now()
    model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, streamer=stamps, **extra)
    return t0, stamps


def hf_ttft(model: Any, ids: list[int]) -> tuple[float, int]:
    t0, stamps = hf_generate(model, ids, 1)
    return (stamps.t_ns[0] - t0) / 1e6, stamps.ids[0]


def hf_decode(model: Any, ids: list[int], k: int) -> float:
    _, stamps = hf_generate(model, ids, k + 1)
    return (stamps.t_ns[k] - stamps.t_ns[0]) / 1e6 / k


def ours_ttft(driver: Any, ids: list[int]) -> tuple[float, int]:
    driver.reset()
    t0 = now()
    token = int(np.argmax(driver.prefill(ids)))
    return (now() - t0) / 1e6, token


def ours_decode(driver: Any, ids: list[int], k: int) -> float:
    driver.reset()
    token = int(np.argmax(driver.prefill(ids)))
    t0 = now()
    for _ in range(k):
        token = int(np.argmax(driver.decode(token)))
    return (now() - t0) / 1e6 / k


def chat_turn2(driver: Any, tokenizer: Any, reuse: bool) -> dict[str, Any]:
    from assistant.dialogue import Dialogue

    driver.reset()
    dialogue = Dialogue(driver, tokenizer, DEFAULT_SYSTEM_PROMPT, CHAT_OPTIONS)
    for _ in dialogue.ask(TURN1):
        pass
    if not reuse:
        driver.reset()
    t0 = now()
    reply = dialogue.ask(TURN2)
    for _ in reply:
        pass
    s = reply.stats
    out = {"ttft": s.ttft_ms, "ask_ttft": (s.t_first_token_ns - t0) / 1e6, "ids": reply.plan.ids}
    return out | {"prompt": s.prompt_tokens, "prefilled": s.prefilled_tokens, "reused": s.reused_tokens}


@dataclass
class Bench:
    """The loaded models plus the table rows, notes and raw results collected so far."""

    args: argparse.Namespace
    driver: Any
    hf: Any  # the transformers model; None with --smoke
    tokenizer: Any  # None with --smoke
    vocab: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    def repeat(self, steps: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
        """Run every step once per run, alternating; keep what the runs after the warmup return."""
        kept: dict[str, list[Any]] = {name: [] for name in steps}
        for i in range(self.args.warmup + self.args.runs):
            for name, step in steps.items():
                result = step()
                if i >= self.args.warmup:
                    kept[name].append(result)
        return kept

    def add(self, metric: str, ours: float, hf: float | None = None, ratio: float | None = None) -> None:
        ratio = ratio if ratio is not None or hf is None else hf / ours
        self.rows.append({"metric": metric, "ours": ours, "transformers": hf, "ratio": ratio})

    def prompt(self, n: int) -> list[int]:
        """Exactly ``n`` ids: repeated English text (random ids with --smoke)."""
        if self.tokenizer is None:
            return [int(i) for i in np.random.default_rng(n).integers(1, self.vocab, n)]
        base = self.tokenizer.encode(FILLER, add_special_tokens=False)
        return (base * (n // len(base) + 1))[:n]

    def both(self, ours: Callable[[], Any], hf: Callable[[], Any]) -> dict[str, list[Any]]:
        return self.repeat({"ours": ours} if self.hf is None else {"ours": ours, "transformers": hf})

    def ttft(self, n: int) -> None:
        ids = self.prompt(n)
        got = self.both(lambda: ours_ttft(self.driver, ids), lambda: hf_ttft(self.hf, ids))
        res = {side: summary([t for t, _ in v]) for side, v in got.items()}
        first = {side: v[0][1] for side, v in got.items()}
        self.raw[f"ttft_{n}"] = {**res, "first_token": first}
        for stat in ("median", "p95"):
            hf = res["transformers"][stat] if self.hf is not None else None
            self.add(f"TTFT @{n} tokens, {stat}", res["ours"][stat], hf)
        if len(set(first.values())) > 1:
            self.notes.append(f"WARNING: the first token differs at {n} tokens: {first}")

    def decode(self) -> None:
        ids, k = self.prompt(self.args.decode_prompt_length), self.args.decode_tokens
        got = self.both(lambda: ours_decode(self.driver, ids, k), lambda: hf_decode(self.hf, ids, k))
        res = {side: summary(v) for side, v in got.items()}
        self.raw["decode_ms_per_token"] = res
        ours, hf = res["ours"]["median"], res["transformers"]["median"] if self.hf is not None else None
        self.add(f"decode ms/token, {k} steps after {len(ids)} tokens, median", ours, hf)
        self.add("decode tokens/s (1000 / median)", 1e3 / ours, hf and 1e3 / hf, hf and hf / ours)

    def chat(self) -> None:
        ids = chat_turn2(self.driver, self.tokenizer, True)["ids"]  # also an extra warmup
        reuse, full = (partial(chat_turn2, self.driver, self.tokenizer, keep) for keep in (True, False))
        got = self.repeat({"reuse": reuse, "full": full, "transformers": partial(hf_ttft, self.hf, ids)})
        hf = summary([t for t, _ in got.pop("transformers")])
        res = {m: {k: summary([r[k] for r in runs]) for k in ("ttft", "ask_ttft")} for m, runs in got.items()}
        counts = {m: {k: runs[0][k] for k in ("prompt", "prefilled", "reused")} for m, runs in got.items()}
        same = all(r["ids"] == ids for runs in got.values() for r in runs)
        self.raw["chat_turn2"] = {**res, "transformers_ttft": hf, "tokens": counts, "prompt_identical": same}
        modes = (("reuse", "prefix reuse"), ("full", "full re-prefill"))
        for mode, what in modes:
            c = counts[mode]
            tokens = f"{c['prefilled']} prefilled + {c['reused']} reused"
            hf_ms = hf["median"] if mode == "full" else None
            self.add(f"turn-2 TTFT, {what} ({tokens}), median", res[mode]["ttft"]["median"], hf_ms)
        for mode, what in modes:
            self.add(f"turn-2 ask -> first token, {what}, median", res[mode]["ask_ttft"]["median"])
        full, reuse = res["full"]["ttft"]["median"], res["reuse"]["ttft"]["median"]
        self.add("turn-2 TTFT speedup from prefix reuse (full / reuse), ×", full / reuse)
        self.notes.append("turn-2 transformers: generate() on the same prompt ids (no cache across calls)")
        if not same:
            self.notes.append("WARNING: the turn-2 prompt was not the same in every run (turn 1 varied)")


def machine(threads: int) -> dict[str, Any]:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name")]
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": names[0] if names else platform.processor(),
    }
    info |= {"cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}
    return info | {"transformers": importlib.metadata.version("transformers"), "threads": threads}


def render(info: dict[str, Any], rows: list[dict[str, Any]], notes: list[str]) -> str:
    def cell(v: float | None, suffix: str = "") -> str:
        return "—" if v is None else f"{v:.2f}{suffix}"

    m = info["machine"]
    lines = [
        "# Decoder benchmark: ours (models/ + engines/torch_backend) vs transformers",
        "",
        f"- machine: {m['platform']}; {m['cpu']}; {m['cpu_count']} CPUs; python {m['python']}, "
        f"torch {m['torch']}, transformers {m['transformers']}; {m['threads']} torch threads",
        f"- model: {info['model']}",
        f"- command: `{info['command']}`",
        f"- {info['runs']} timed runs after {info['warmup']} warmup; times in ms; "
        "ratio = how many times faster ours is (transformers ms / ours ms)",
        "",
        "| metric | ours | transformers | ratio |",
        "|---|---:|---:|---:|",
    ]
    for r in rows:
        values = (cell(r["ours"]), cell(r["transformers"]), cell(r["ratio"], "×"))
        lines.append(f"| {r['metric']} | {' | '.join(values)} |")
    return "\n".join(lines + [""] + [f"- {n}" for n in notes])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Metric definitions: see this script's docstring.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    # $XDG_CACHE_HOME (or ~/.cache)/assistant/models/<default LLM>, as the assistant resolves it
    store_path = ModelStore(ModelSettings().store_dir).path(DEFAULT_LLM)
    p.add_argument("--model-dir", type=Path, default=store_path, help="Llama/Qwen2 safetensors folder")
    p.add_argument("--prompt-lengths", default="128", help="TTFT prompt lengths in tokens, e.g. 32,128,512")
    p.add_argument("--decode-tokens", type=int, default=64, help="decode steps timed per run")
    p.add_argument("--decode-prompt-length", type=int, default=128, help="prompt tokens before decoding")
    p.add_argument("--runs", type=int, default=10, help="timed runs per metric")
    p.add_argument("--warmup", type=int, default=2, help="untimed runs before the timed ones")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads, for both sides")
    p.add_argument("--json", type=Path, default=Path("bench-decoder.json"), help="write the results here")
    smoke = "tiny random-weight model, ours only, at most 2 runs, 1 warmup, 8 decode steps (for CI)"
    p.add_argument("--smoke", action="store_true", help=smoke)
    args = p.parse_args(argv)
    try:
        args.prompt_lengths = [int(s) for s in args.prompt_lengths.split(",") if s.strip()]
    except ValueError:
        p.error(f"--prompt-lengths: expected integers like 32,128,512, got {args.prompt_lengths!r}")
    counts = [*args.prompt_lengths, args.decode_tokens, args.decode_prompt_length, args.runs, args.threads]
    if not args.prompt_lengths or min(counts) < 1 or args.warmup < 0:
        p.error("lengths, --decode-tokens, --decode-prompt-length, --runs, --threads must be >= 1")
    if args.smoke:
        args.runs, args.warmup = min(args.runs, 2), min(args.warmup, 1)
        args.decode_tokens = min(args.decode_tokens, 8)
    return args


def load(args: argparse.Namespace, tmp: Path) -> tuple[Path, str, Any, Any]:
    """The model folder, its description, the tokenizer and the transformers model (None, None: smoke)."""
    if args.smoke:
        from safetensors.torch import save_file

        (tmp / "config.json").write_text(json.dumps(TINY))
        torch.manual_seed(0)
        state = Decoder(DecoderConfig.from_hf(TINY)).state_dict()
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        return (
            tmp,
            "tiny random-weight Llama (--smoke): 2 layers, hidden 64, 4/2 heads, vocab 256",
            None,
            None,
        )
    if not (args.model_dir / "config.json").is_file():
        sys.exit(f"no model at {args.model_dir}: run 'assistant models fetch' or pass --model-dir")
    import transformers

    from assistant.llm import load_tokenizer

    transformers.logging.set_verbosity_error()
    hf = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval()
    return args.model_dir, str(args.model_dir), load_tokenizer(args.model_dir), hf


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-decoder-") as tmp:
        model_dir, label, tokenizer, hf = load(args, Path(tmp))
        config = DecoderConfig.from_dir(model_dir)
        needed = max(*args.prompt_lengths, args.decode_prompt_length + args.decode_tokens)
        if needed > config.max_position_embeddings:
            sys.exit(f"{needed} tokens needed; the model allows {config.max_position_embeddings}")
        cache = max(needed, 2048)  # load_torch_decoder caps it at the model's max positions
        options = TorchBackendOptions(device="cpu", dtype="fp32", capacity_tokens=cache, threads=args.threads)
        driver = load_torch_decoder(model_dir, tokenizer, options)
        torch.set_num_threads(args.threads)  # load_torch_decoder sets it too; both sides share it
        bench = Bench(args, driver, hf, tokenizer, config.vocab_size)
        for n in args.prompt_lengths:
            bench.ttft(n)
        bench.decode()
        if tokenizer is not None:
            bench.chat()
        else:
            bench.notes.append("--smoke: transformers, the tokenizer and the chat metrics are skipped")
    info = {"machine": machine(args.threads), "model": label, "command": shlex.join(sys.orig_argv)}
    info |= {"runs": args.runs, "warmup": args.warmup}
    print(render(info, bench.rows, bench.notes))
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    doc = {**info, "settings": settings, "rows": bench.rows, "notes": bench.notes, "results": bench.raw}
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Many voice sessions on one served decoder: in-flight batching vs sequential batch-1, one run.

Starts ``assistant serve``'s Triton (:class:`assistant.modes.serve.TritonProcess`) several times on
the same model: with ``--sequences`` rows (in-flight batching) once per ``--prefill-chunks``
value (1024: newcomers' prompts ride in the decode steps; 0: each is prefilled between steps),
then with 1 row (requests decoded one at a time: what one decoder per box gives; skip it with
``--no-sequential``). For each load of N concurrent simulated voice
sessions, every session runs ``--turns`` turns: a prompt of the conversation so far plus
``--prompt-tokens`` new random token ids, a reply of ``--reply-tokens`` (the model's end token
is disabled so every reply has that length), then ``--think-ms`` of "user speaking". Measured
on the client, per request:

- TTFT: request sent -> first token id received (includes the queue for a row);
- ms/token: (last token - first token) / (tokens - 1);
- token gap P99: of every interval between two tokens of a reply (a join that stalls the
  running sessions shows here);
- network: TTFT - the server's own arrival -> first token (gRPC, Triton, our stream thread);
- server TTFT P99: of the server's own arrival -> first token (a stall outside the model,
  which hits many streams at once, shows in TTFT but not here).

Prints a markdown table (requests/s, tokens/s, TTFT P50/P95/P99, ms/token P50, network P50) and
writes ``--json`` with every sample and the machine. ``--model`` is a folder of safetensors;
``--random-model NAME`` writes random weights of a real model's shape from its config fields
(llama-1b: Llama-3.2-1B; smollm2: SmolLM2-135M; tiny: a CI smoke model).

    python -m bench.serve --random-model llama-1b --dtype bf16 --device cuda --sessions 1,4,16,64
    python -m bench.serve --random-model tiny --sessions 1,2 --turns 1 --json out.json  # CI smoke
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from assistant.modes.serve import ServeSettings, TritonProcess
from engines.base import GenerationOptions
from engines.serving.remote import _Stream
from engines.serving.wire import ServeOptions

SHAPES: dict[str, dict[str, Any]] = {
    "llama-1b": dict(  # meta-llama/Llama-3.2-1B-Instruct's config.json
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
        rope_theta=500000.0, tie_word_embeddings=True,
    ),
    "smollm2": dict(  # HuggingFaceTB/SmolLM2-135M-Instruct
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
        rope_theta=100000.0, tie_word_embeddings=True,
    ),
    "tiny": dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        rope_theta=10000.0, tie_word_embeddings=True,
    ),
}  # fmt: skip


def random_model(name: str, folder: Path) -> Path:
    """Random weights of ``name``'s shape (transformers' Llama class), saved as safetensors."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[name], eos_token_id=-1, bos_token_id=0)  # no end token: fixed lengths
    model: Any = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16 if name == "llama-1b" else torch.float32)
    model.save_pretrained(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session(
    url: str, index: int, args: argparse.Namespace, vocab: int, out: list[dict], start: threading.Barrier
):
    """One simulated voice session: ``turns`` turns, each a request on its own stream."""
    import tritonclient.grpc as grpcclient

    rng = np.random.default_rng(index)
    client = grpcclient.InferenceServerClient(url)
    history: list[int] = []
    options = GenerationOptions(max_new_tokens=args.reply_tokens)
    start.wait()
    for turn in range(args.turns):
        prompt = history + rng.integers(1, vocab, args.prompt_tokens).tolist()
        stream = _Stream(client, url)
        sent = time.monotonic_ns()
        stream.send(f"s{index}", prompt, options)
        times, reply = [], []
        while (token := stream.next_token()) is not None:
            times.append(time.monotonic_ns())
            reply.append(token)
        stream.close()
        ttft_ms = (times[0] - sent) / 1e6
        per_token = (times[-1] - times[0]) / 1e6 / max(len(times) - 1, 1)
        out.append(
            {
                "session": index, "turn": turn, "prompt_tokens": len(prompt), "tokens": len(reply),
                "ttft_ms": ttft_ms, "ms_per_token": per_token, "reused": stream.reused_tokens,
                "network_ms": max(ttft_ms - stream.first_server_us / 1000, 0.0),
                "gaps_ms": [round((b - a) / 1e6, 3) for a, b in zip(times, times[1:], strict=False)],
                "sent_ns": sent, "done_ns": times[-1],
            }
        )  # fmt: skip
        history = prompt + reply
        time.sleep(args.think_ms / 1000)
    client.close()


def load(url: str, sessions: int, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """N concurrent sessions against ``url``; the row of the table."""
    samples: list[dict] = []
    start = threading.Barrier(sessions)
    threads = [
        threading.Thread(target=session, args=(url, i, args, vocab, samples, start)) for i in range(sessions)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall_s = (max(s["done_ns"] for s in samples) - min(s["sent_ns"] for s in samples)) / 1e9
    ttft = np.array([s["ttft_ms"] for s in samples])
    return {
        "sessions": sessions,
        "requests": len(samples),
        "requests_per_s": len(samples) / wall_s,
        "tokens_per_s": sum(s["tokens"] for s in samples) / wall_s,
        "ttft_p50_ms": float(np.percentile(ttft, 50)),
        "ttft_p95_ms": float(np.percentile(ttft, 95)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "ms_per_token_p50": float(np.median([s["ms_per_token"] for s in samples])),
        "gap_p99_ms": float(np.percentile([g for s in samples for g in s["gaps_ms"]] or [0.0], 99)),
        "network_p50_ms": float(np.median([s["network_ms"] for s in samples])),
        "server_ttft_p99_ms": float(np.percentile([s["ttft_ms"] - s["network_ms"] for s in samples], 99)),
        "samples": samples,
    }


class NoText:
    """The driver's detokenizer for a model without a tokenizer (ids only)."""

    eos_token_id = None

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return ""


def check_replies(url: str, model_dir: Path, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """Served greedy replies of 4 concurrent prompts vs the same weights run here at batch 1 (eager).

    The check that the wire carries the right ids both ways; on a GPU in reduced precision a
    batch and a batch-1 run may round differently, so the count of equal tokens is reported
    rather than required.
    """
    import torch

    from engines.driver import DecoderDriver
    from engines.torch_backend import TorchBackendOptions, TorchStep, resolve_device
    from models.config import DecoderConfig
    from models.weights import load_decoder

    device, dtype = resolve_device(TorchBackendOptions(device=args.device, dtype=args.dtype))
    step = TorchStep(load_decoder(model_dir, dtype=dtype, device=device), 512)
    eos = DecoderConfig.from_dir(model_dir).eos_token_ids  # the server stops at them too
    driver = DecoderDriver(step, NoText(), eos)
    options = GenerationOptions(max_new_tokens=args.reply_tokens)
    rng = np.random.default_rng(1234)
    prompts = [rng.integers(1, vocab, args.prompt_tokens).tolist() for _ in range(4)]
    expected = []
    for prompt in prompts:
        driver.reset()
        expected.append([c.token_id for c in driver.generate(prompt, options) if c.token_id >= 0])
    del step, driver
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    got: list[list[int]] = [[] for _ in prompts]

    def ask(i: int) -> None:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(url)
        stream = _Stream(client, url)
        stream.send(f"check{i}", prompts[i], options)
        while (token := stream.next_token()) is not None:
            got[i].append(token)
        stream.close()
        client.close()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    same = sum(a == b for g, e in zip(got, expected, strict=True) for a, b in zip(g, e, strict=False))
    total = sum(len(e) for e in expected)
    first_diff = [
        next((k for k, (a, b) in enumerate(zip(g, e, strict=False)) if a != b), None)
        for g, e in zip(got, expected, strict=True)
    ]
    identical = sum(g == e for g, e in zip(got, expected, strict=True))
    return {"identical_replies": identical, "replies": len(prompts),
            "equal_tokens": same, "tokens": total, "first_difference": first_diff}  # fmt: skip


def serve_and_load(
    model_dir: Path, rows: int, args: argparse.Namespace, vocab: int, prefill_chunk: int = 0
) -> list[dict[str, Any]]:
    """Start the server with ``rows`` rows, warm it up, run every load."""
    settings = ServeSettings(port=free_port(), sequences=rows, queue_delay_us=args.queue_delay_us)
    context = args.turns * (args.prompt_tokens + args.reply_tokens) + 64
    options = ServeOptions(
        model_dir=model_dir.resolve(), sequences=rows, context_tokens=context, device=args.device,
        dtype=args.dtype, threads=args.threads, queue_delay_us=args.queue_delay_us,
        prefill_chunk=prefill_chunk,
    )  # fmt: skip
    suffix = f".rows{rows}" + (f".chunk{prefill_chunk}" if rows > 1 else "")
    log = None if args.server_log is None else args.server_log.with_suffix(f"{suffix}.log")
    server = TritonProcess(options, settings, log)
    try:
        server.wait_ready()
        warm = argparse.Namespace(**{**vars(args), "turns": 1, "think_ms": 0})
        load(server.url, min(rows, 4), warm, vocab)  # first steps, allocator, gRPC warm
        rows_ = [load(server.url, n, args, vocab) for n in args.sessions]
        if rows > 1:
            check = check_replies(server.url, model_dir, args, vocab)
            print(f"served vs batch-1 here (rows {rows}): {check}", flush=True)
            rows_[0]["check"] = check
        return rows_
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="a model folder (config.json + safetensors)")
    source.add_argument("--random-model", choices=sorted(SHAPES), help="random weights of this shape")
    parser.add_argument("--sessions", default="1,4,16,64", help="concurrent sessions, comma-separated")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--reply-tokens", type=int, default=32)
    parser.add_argument("--think-ms", type=float, default=200.0)
    parser.add_argument("--rows", type=int, default=0, help="server rows (default: the largest --sessions)")
    parser.add_argument("--queue-delay-us", type=int, default=100)
    parser.add_argument(
        "--prefill-chunks", default="1024,0", help="the batched server's --prefill-chunk values, one run each"
    )
    parser.add_argument("--no-sequential", action="store_true", help="skip the one-row server")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--server-log", type=Path, help="keep tritonserver's log here (.rowsN.log)")
    args = parser.parse_args(argv)
    args.sessions = [int(n) for n in args.sessions.split(",")]
    rows = args.rows or max(args.sessions)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or random_model(args.random_model, Path(tmp) / args.random_model)
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        results = {
            f"batched, prefill chunk {chunk}": serve_and_load(model_dir, rows, args, vocab, chunk)
            for chunk in (int(c) for c in args.prefill_chunks.split(","))
        }
        if not args.no_sequential:
            results["sequential"] = serve_and_load(model_dir, 1, args, vocab)
    print(f"\n`{shlex.join(['python', '-m', 'bench.serve', *(argv or sys.argv[1:])])}`\n")
    header = "| server | sessions | requests/s | tokens/s | TTFT P50 / P95 / P99 ms | ms/token P50 |"
    print(header + " token gap P99 ms | network P50 ms | server TTFT P99 ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, rows_ in results.items():
        for r in rows_:
            print(
                f"| {mode} | {r['sessions']} | {r['requests_per_s']:.1f} | {r['tokens_per_s']:.0f} | "
                f"{r['ttft_p50_ms']:.1f} / {r['ttft_p95_ms']:.1f} / {r['ttft_p99_ms']:.1f} | "
                f"{r['ms_per_token_p50']:.2f} | {r['gap_p99_ms']:.2f} | "
                f"{r['network_p50_ms']:.2f} | {r['server_ttft_p99_ms']:.1f} |"
            )
    if args.json:
        doc = {
            "command": shlex.join(["python", "-m", "bench.serve", *(argv or sys.argv[1:])]),
            "machine": {"platform": platform.platform(), "python": platform.python_version(), **gpu()},
            "settings": {k: str(v) for k, v in vars(args).items()},
            "results": results,
        }
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


def gpu() -> dict[str, str]:
    import torch

    return {"gpu": torch.cuda.get_device_name(0)} if torch.cuda.is_available() else {"gpu": "none"}


if __name__ == "__main__":
    sys.exit(main())

"""Time to the first spoken chunk with and without the first-chunk word cut, on the real LLM.

Each question is asked once (a fresh conversation each, greedy, the bundled SmolLM2 on the
chosen backend); its token stream is then split twice from the same token timestamps, with
``first_chunk_words=0`` (sentence and first-clause cuts only) and with ``first_chunk_words=N``.
The time to the first chunk runs from prompt submitted (``GenerationStats.t_submit_ns``) to
the ``t_ns`` of the token whose text completed that chunk (the reply's end when only the
final flush produces it), which is what ``first_sentence_ms`` measures in the pipeline less
the microseconds of splitting. A warm-up question is asked first and not counted. Prints a
table and writes JSON.

    python -m bench.first_chunk --json docs/results/bench-first-chunk-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from assistant.config import load_settings
from assistant.modes.offline import stay_offline
from assistant.stages.dialogue import Dialogue
from assistant.stages.llm import load_llm
from assistant.stages.splitter import SentenceSplitter, SplitterOptions
from bench.corpus import OPEN_QUESTIONS as QUESTIONS
from bench.corpus import WARM_UP


@dataclass(frozen=True)
class FirstChunk:
    """The reply's first chunk under one splitter setting."""

    text: str
    ms: float  # prompt submitted -> the token that completed it
    tokens: int  # generated tokens up to and including that token

    @property
    def words(self) -> int:
        return len(self.text.split())

    def as_json(self) -> dict[str, Any]:
        return {"chunk": self.text, "ms": self.ms, "tokens": self.tokens, "words": self.words}


def first_chunk(stream: list[tuple[int, str]], t_submit_ns: int, t_done_ns: int, words: int) -> FirstChunk:
    """Replay ``stream`` ((t_ns, text) per token) through a splitter; when was its first chunk ready."""
    splitter = SentenceSplitter(SplitterOptions(first_chunk_words=words))
    for n, (t_ns, text) in enumerate(stream, 1):
        out = splitter.push(text)
        if out:
            return FirstChunk(out[0], (t_ns - t_submit_ns) / 1e6, n)
    out = splitter.flush()
    return FirstChunk(out[0] if out else "", (t_done_ns - t_submit_ns) / 1e6, len(stream))


def ask(dialogue: Dialogue, question: str) -> tuple[list[tuple[int, str]], int, int, str]:
    reply = dialogue.ask(question)
    stream = [(c.t_ns, c.text) for c in reply if c.token_id >= 0]
    return stream, reply.stats.t_submit_ns, reply.stats.t_done_ns, reply.stats.text


def percentiles(values: list[float]) -> dict[str, float]:
    a = np.array(values, dtype=np.float64)
    return {"median": float(np.median(a)), "p95": float(np.percentile(a, 95)), "max": float(a.max())}


def main(argv: list[str] | None = None) -> int:
    stay_offline()  # no telemetry from ONNX Runtime, no hub lookups (assistant/modes/offline.py)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="store name or folder")
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--words", type=int, default=5, help="first_chunk_words to compare with 0")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    settings = load_settings(
        None,
        env={},
        overrides={
            "models.llm": args.model,
            "decoder.backend": args.backend,
            "decoder.threads": args.threads,
            "generation.max_new_tokens": args.max_new_tokens,
        },
    )
    decoder, tokenizer = load_llm(settings.models, settings.decoder, settings.engine)
    backend = decoder.name

    def dialogue() -> Dialogue:  # a fresh conversation; the decoder keeps the system prompt cached
        return Dialogue(decoder, tokenizer, settings.dialogue.system_prompt, settings.generation.options())

    dialogue().warm_up()
    ask(dialogue(), WARM_UP)
    rows: list[dict[str, Any]] = []
    firsts: list[tuple[FirstChunk, FirstChunk]] = []
    for question in QUESTIONS:
        stream, t_submit_ns, t_done_ns, reply = ask(dialogue(), question)
        off = first_chunk(stream, t_submit_ns, t_done_ns, 0)
        on = first_chunk(stream, t_submit_ns, t_done_ns, args.words)
        steps_ms = np.diff([t for t, _ in stream]) / 1e6
        firsts.append((off, on))
        rows.append(
            {
                "question": question,
                "reply": reply,
                "tokens": len(stream),
                "ttft_ms": (stream[0][0] - t_submit_ns) / 1e6 if stream else None,
                "ms_per_token": float(np.median(steps_ms)) if steps_ms.size else None,
                "off": off.as_json(),
                "on": on.as_json(),
                "saved_ms": off.ms - on.ms,
            }
        )
    n = args.words
    summary = {
        "first_chunk_ms_words_0": percentiles([off.ms for off, _ in firsts]),
        f"first_chunk_ms_words_{n}": percentiles([on.ms for _, on in firsts]),
        "saved_ms": percentiles([off.ms - on.ms for off, on in firsts]),
        "words_in_first_chunk_words_0": percentiles([off.words for off, _ in firsts]),
        f"words_in_first_chunk_words_{n}": percentiles([on.words for _, on in firsts]),
        "ms_per_token": percentiles([r["ms_per_token"] for r in rows if r["ms_per_token"] is not None]),
    }
    cut_by_words = sum(on.tokens < off.tokens for off, on in firsts)
    print(f"\nmodel {args.model}, backend {backend}, threads {args.threads}, {len(rows)} questions")
    print(f"| question | words=0: ms | words | words={n}: ms | words | saved ms | first chunk (words={n}) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for question, (off, on) in zip(QUESTIONS, firsts, strict=True):
        print(
            f"| {question} | {off.ms:.0f} | {off.words} | {on.ms:.0f} | {on.words} | "
            f"{off.ms - on.ms:.0f} | {on.text} |"
        )
    for label, key in (("median", "median"), ("P95", "p95")):
        print(
            f"| **{label}** | {summary['first_chunk_ms_words_0'][key]:.0f} | "
            f"{summary['words_in_first_chunk_words_0'][key]:.0f} | "
            f"{summary[f'first_chunk_ms_words_{n}'][key]:.0f} | "
            f"{summary[f'words_in_first_chunk_words_{n}'][key]:.0f} | {summary['saved_ms'][key]:.0f} | |"
        )
    print(
        f"\ncut by the word rule: {cut_by_words} of {len(rows)}; "
        f"decode {summary['ms_per_token']['median']:.1f} ms/token (median)"
    )
    if args.json:
        out = {
            "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "machine": {
                "platform": platform.platform(),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_average_after": os.getloadavg(),
            },
            "model": args.model,
            "backend": backend,
            "threads": args.threads,
            "first_chunk_words": n,
            "max_new_tokens": args.max_new_tokens,
            "summary": summary,
            "cut_by_words": cut_by_words,
            "rows": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

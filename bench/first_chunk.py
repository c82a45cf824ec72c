"""Time to the first spoken chunk under several first-chunk word cuts, on the real LLM.

Each question is asked once (a fresh conversation each, greedy, the bundled SmolLM2 on the
chosen backend); its token stream is then split from the same token timestamps once per
setting of ``--words``: ``0`` is the sentence and first-clause cuts only, ``N`` also cuts after
N words (moving on to a word a phrase can end on: ``assistant.stages.splitter``).
The time to the first chunk runs from prompt submitted (``GenerationStats.t_submit_ns``) to
the ``t_ns`` of the token whose text completed that chunk (the reply's end when only the
final flush produces it), which is what ``first_sentence_ms`` measures in the pipeline less
the microseconds of splitting. A warm-up question is asked first and not counted. Prints a
table and writes JSON.

    python -m bench.first_chunk --words 0,3,4,5 --json docs/results/bench-first-chunk-cpu.json

``--speak DIR`` also writes each setting's first chunk and the rest of the first sentence as
the default TTS speaks them, one WAV a question and setting, to listen to the seam.
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


def speak_seams(rows: list[dict[str, Any]], settings_words: list[int], folder: Path) -> None:
    """Each setting's first chunk, then the rest of the first sentence, spoken as the pipeline
    speaks them (two syntheses played back to back), one WAV per question and setting."""
    import soundfile

    from assistant.stages.tts import Synthesizer, TtsOptions

    folder.mkdir(parents=True, exist_ok=True)
    synth = Synthesizer(TtsOptions())
    try:
        for i, row in enumerate(rows):
            sentence = SentenceSplitter(SplitterOptions(first_chunk_words=0))
            whole = [*sentence.push(row["reply"]), *sentence.flush()]
            first_sentence = whole[0] if whole else ""
            for n in settings_words:
                chunk = row["first_chunks"][str(n)]["chunk"]
                rest = first_sentence[len(chunk) :].strip() if first_sentence.startswith(chunk) else ""
                audio = [synth.synthesize(t) for t in (chunk, rest) if t]
                samples = np.concatenate(audio) if audio else np.zeros(1, np.float32)
                soundfile.write(folder / f"q{i:02d}-words{n}.wav", samples, synth.options.sample_rate_hz)
    finally:
        synth.close()


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
    parser.add_argument("--words", default="0,5", help="first_chunk_words settings, comma-separated")
    parser.add_argument("--speak", type=Path, help="write the first chunks, spoken, to this folder")
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
    settings_words = [int(w) for w in args.words.split(",")]
    rows: list[dict[str, Any]] = []
    for question in QUESTIONS:
        stream, t_submit_ns, t_done_ns, reply = ask(dialogue(), question)
        steps_ms = np.diff([t for t, _ in stream]) / 1e6
        chunks = {n: first_chunk(stream, t_submit_ns, t_done_ns, n) for n in settings_words}
        rows.append(
            {
                "question": question,
                "reply": reply,
                "tokens": len(stream),
                "ttft_ms": (stream[0][0] - t_submit_ns) / 1e6 if stream else None,
                "ms_per_token": float(np.median(steps_ms)) if steps_ms.size else None,
                "first_chunks": {str(n): c.as_json() for n, c in chunks.items()},
            }
        )
    summary: dict[str, Any] = {
        f"words_{n}": {
            "first_chunk_ms": percentiles([r["first_chunks"][str(n)]["ms"] for r in rows]),
            "words": percentiles([r["first_chunks"][str(n)]["words"] for r in rows]),
        }
        for n in settings_words
    }
    summary["ms_per_token"] = percentiles([r["ms_per_token"] for r in rows if r["ms_per_token"] is not None])
    print(f"\nmodel {args.model}, backend {backend}, threads {args.threads}, {len(rows)} questions")
    print("| first_chunk_words | first chunk median (ms) | P95 (ms) | words median | words P95 |")
    print("|---|---:|---:|---:|---:|")
    for n in settings_words:
        ms, words = summary[f"words_{n}"]["first_chunk_ms"], summary[f"words_{n}"]["words"]
        label = f"{n}" if n else "0 (sentence or first clause)"
        print(
            f"| {label} | {ms['median']:.0f} | {ms['p95']:.0f} | {words['median']:.0f} | {words['p95']:.0f} |"
        )
    print(f"\ndecode {summary['ms_per_token']['median']:.1f} ms/token (median); first chunks:")
    for r in rows:
        print(
            f"- {r['question']}: "
            + " | ".join(f"{n}: {r['first_chunks'][str(n)]['chunk']!r}" for n in settings_words)
        )
    if args.speak:
        speak_seams(rows, settings_words, args.speak)
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
            "first_chunk_words": settings_words,
            "max_new_tokens": args.max_new_tokens,
            "summary": summary,
            "rows": rows,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

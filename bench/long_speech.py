"""Long speech before/after (issue #8, defect 3): what ASR keeps of 2 minutes, what a short question costs.

Runs the ASR stage of a git revision (``--before``, default ``main``: its ``assistant/stages/asr.py``
loaded from git) and of this working tree side by side, in one process, on the same model:

- long: 24 numbered sentences ("Sentence number one. The weather is ...", ~2 minutes of
  espeak-ng speech) in three voices, transcribed whole as file mode does; counts the numbers
  that reach the transcript, and times it.
- live (this tree only): the en-us recording through the endpointer (default settings:
  Smart Turn, cuts at 20 s) and the pipeline, turn after turn: the numbers in the answered
  transcript, the ASR time spent on held turns while the user speaks, and the ASR time of
  the turn that ends the utterance (what the user waits for after stopping, before the LLM).
- short: 12 one-sentence questions in five voices, each transcribed ``--repeats`` times by
  both, interleaved (before, after, before, ...) so that load on the machine hits both alike;
  median and P95 ASR time, and whether the transcripts are the same.

Prints markdown tables and writes JSON:

    python -m bench.long_speech --json docs/results/bench-long-speech-cpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from assistant.config import ModelSettings
from assistant.stages.asr import AsrOptions, Transcriber
from bench.corpus import LONG_VOICES, VOICES
from bench.corpus import SHORT_QUESTIONS as QUESTIONS
from bench.speech import COUNT, missing_numbers, numbered_sentences, speak
from store.bundled import ModelStore

ROOT = Path(__file__).resolve().parents[1]  # the source checkout: --before REV reads its git history


def load_before(rev: str) -> type:
    """``Transcriber`` of ``assistant/stages/asr.py`` at git revision ``rev``."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:assistant/stages/asr.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "asr_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("asr_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["asr_before"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.Transcriber


@dataclass
class Live:
    """Long speech as live turns: what was kept and what ASR cost."""

    cuts: int
    numbers: int
    missing: list[int]
    held_asr_ms: float  # on held turns, while the user speaks
    final_asr_ms: float  # of the turn that ends the utterance: waited for
    text: str


def held_live(audio: np.ndarray, threads: int) -> Live:
    """Long speech as live turns: cut for length, held, answered once (this tree's pipeline)."""
    from assistant.app import build_session
    from assistant.config import load_settings
    from assistant.events import Event, SpeechEnded, TranscriptReady

    events: list[Event] = []
    overrides = {"decoder.backend": "pytorch", "decoder.threads": threads, "asr.cpu_threads": threads}
    settings = load_settings(None, overrides={**overrides, "generation.max_new_tokens": 12})
    session = build_session(settings, devices=False, asr=True, tts=False, emit=events.append)
    try:
        fed = session.endpointer().feed_recording(np.concatenate([audio, np.zeros(32000, np.float32)]))
        last_end = {e.turn_id: e for e in fed if isinstance(e, SpeechEnded)}  # rejoined turns: the last end
        held_ms = 0.0
        for utterance in last_end.values():
            start_ns = time.monotonic_ns()
            session.pipeline.run_turn(utterance, None, threading.Event())
            held_ms += (time.monotonic_ns() - start_ns) / 1e6 if utterance.cut else 0.0
        (record,) = session.pipeline.records
        final = [e for e in events if isinstance(e, TranscriptReady) and e.turn_id == record.turn_id][-1]
        missing = missing_numbers(record.transcript)
        cuts = sum(e.cut for e in last_end.values())
        return Live(cuts, COUNT - len(missing), missing, held_ms, final.asr_ms, record.transcript)
    finally:
        session.close()


def p95(values: list[float]) -> float:
    return float(np.percentile(values, 95))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="main", help="git revision of the old ASR stage (default main)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load_start = os.getloadavg()[0]
    store = ModelStore(ModelSettings().store_dir)
    options = AsrOptions(device="cpu", cpu_threads=args.threads)
    before = load_before(args.before)(options, store)
    after = Transcriber(options, store)
    before.warm_up()
    after.warm_up()
    side = {"before": before, "after": after}
    long_rows: list[dict[str, object]] = []
    short: dict[str, list[float]] = {"before": [], "after": []}
    same = 0
    with tempfile.TemporaryDirectory() as tmp:
        for voice, wpm in LONG_VOICES:
            audio = speak(numbered_sentences(COUNT), Path(tmp), f"long-{voice}", speed_wpm=wpm, voice=voice)
            row: dict[str, object] = {"voice": voice, "wpm": wpm, "audio_s": round(audio.size / 16000, 1)}
            for name, asr in side.items():
                result = asr.transcribe(audio)
                missing = missing_numbers(result.text)
                row[name] = {"numbers": COUNT - len(missing), "missing": missing, "asr_ms": result.asr_ms}
                row[f"{name}_text"] = result.text
            long_rows.append(row)
            if voice == "en-us":
                live = held_live(audio, args.threads)
        questions = [
            speak(
                text,
                Path(tmp),
                f"q{i}",
                speed_wpm=VOICES[i % len(VOICES)][1],
                voice=VOICES[i % len(VOICES)][0],
            )
            for i, text in enumerate(QUESTIONS)
        ]
        for _ in range(args.repeats):
            for audio in questions:
                texts = []
                for name, asr in side.items():
                    result = asr.transcribe(audio)
                    short[name].append(result.asr_ms)
                    texts.append(result.text)
                same += texts[0] == texts[1]
    n = len(short["after"])
    command = " ".join(["python -m bench.long_speech", *sys.argv[1:]])
    load = f"1-min load average {load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"
    print(f"# {command}  ({load}, {args.threads} ASR threads)\n")
    print(
        "| recording | numbers before | numbers after | ASR before | ASR after |\n|---|---:|---:|---:|---:|"
    )
    for r in long_rows:
        b, a = r["before"], r["after"]
        assert isinstance(b, dict) and isinstance(a, dict)
        print(
            f"| {r['audio_s']} s, espeak-ng {r['voice']} {r['wpm']} wpm | {b['numbers']}/{COUNT} "
            f"| {a['numbers']}/{COUNT} | {b['asr_ms'] / 1000:.1f} s | {a['asr_ms'] / 1000:.1f} s |"
        )
    print(
        f"\nlive, {long_rows[0]['audio_s']} s en-us, default settings: {live.cuts} cuts, "
        f"{live.numbers}/{COUNT} numbers in the one answered transcript; ASR of held turns "
        f"while speaking {live.held_asr_ms / 1000:.1f} s in all, of the last turn "
        f"{live.final_asr_ms / 1000:.1f} s"
    )
    print(f"\n| short questions ({n} runs each) | median ms | P95 ms |\n|---|---:|---:|")
    for name in ("before", "after"):
        print(f"| {name} | {np.median(short[name]):.0f} | {p95(short[name]):.0f} |")
    print(f"\nsame transcript before and after: {same}/{n}")
    if args.json:
        report = {
            "command": command,
            "before": args.before,
            "threads": args.threads,
            "load": load,
            "time": time.strftime("%Y-%m-%d %H:%M:%S"),
            "long": long_rows,
            "live": asdict(live),
            "short_ms": {
                k: {"median": float(np.median(v)), "p95": p95(v), "runs": v} for k, v in short.items()
            },
            "short_same_transcript": same,
            "short_runs": n,
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

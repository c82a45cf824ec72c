"""Soak test: many turns through the real live loop; fails when memory keeps growing.

Runs ``assistant run --no-tui`` (with ``--metrics-port`` and ``--log``) on the private
PulseAudio of ``scripts/virtual-audio.sh`` and asks ``--turns`` questions, one at a time:
spoken ones (espeak-ng, several questions and voices, played into the virtual microphone)
mixed with typed ones (standard input; also answered aloud, so they are quicker only by the
question's own seconds). Every ``--sample-every`` turns, while the app is idle, it reads the
app's RSS (/proc/PID/status), GPU memory (NVML, where present) and the app's ``/metrics``,
whose turn counter must equal the log's records. At the end: growth per 100 turns (a
least-squares line from the later of the first ``--warmup-share`` of the turns and the first
context trim, when the conversation has filled the context) and latency percentiles from the
turn log. Exit status 1, with the reasons, when growth exceeds ``--max-growth-mb`` and goes on
over the last half of those turns (a one-off step is an allocator's high-water mark, not a
leak), the app dies, a turn is not answered within ``--turn-timeout-s``, a reply is cut, the
app reports a lost sound device, or the counts disagree.

    python -m bench.soak --turns 200 --json soak.json -- --max-new-tokens 32

Arguments after ``--`` go to ``assistant run``. docs/monitoring.md says how a booth uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from assistant.observe.gpu import GpuMonitor
from bench import soak_report as report_
from bench.corpus import SOAK_SPOKEN as SPOKEN
from bench.corpus import SOAK_TYPED as TYPED
from bench.corpus import VOICES
from bench.speech import speak

ROOT = Path(__file__).resolve().parents[1]  # the source checkout: scripts/virtual-audio.sh, git describe

SETTLE_S = 1.5  # after a spoken question ends: speech still to come would have started (1.2 s cap)
SPEAK_GAP_S = 0.3  # after a turn, before the next question is played: the microphone reopens


class AppFailed(RuntimeError):
    """The app died, or a turn was not answered in time."""


class App:
    """``assistant run --no-tui`` with its stdout read on a thread: turn starts and ends, notices."""

    def __init__(self, cmd: list[str], env: dict[str, str], work: Path) -> None:
        self.stderr_path = work / "app-stderr.txt"
        pipes: dict[str, Any] = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE}
        with self.stderr_path.open("w") as stderr:  # a file: PortAudio's lines must not fill a pipe
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, text=True, stderr=stderr, **pipes)
        self.lines: list[str] = []
        self.heard: set[int] = set()
        self.done: list[int] = []
        self.losses: list[str] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, name="app-stdout", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                if m := re.match(r"\[turn (\d+)\] hearing", line):
                    self.heard.add(int(m[1]))
                elif m := re.match(r"turn (\d+) \|", line):
                    self.done.append(int(m[1]))
                elif re.match(r"audio: \w+ lost", line):
                    self.losses.append(f"{line.strip()} (after turn {len(self.done)})")
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def tail(self) -> str:
        err = self.stderr_path.read_text(errors="replace")[-2000:]
        return "\n".join(self.lines[-15:]) + f"\n--- stderr ({self.stderr_path}) ---\n{err}"

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Until ``ready()`` holds; :class:`AppFailed` when the app ends or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not ready():
                if self.proc.poll() is not None:
                    raise AppFailed(
                        f"the app died (exit status {self.proc.returncode}) {what}\n{self.tail()}"
                    )
                if time.monotonic() > deadline:
                    raise AppFailed(
                        f"no answer within {timeout_s:g} s (--turn-timeout-s) {what}\n{self.tail()}"
                    )
                self.cond.wait(0.2)

    def ask(
        self, text: str | None, wav: Path | None, env: dict[str, str], timeout_s: float, what: str
    ) -> None:
        """Type ``text`` or play ``wav`` into the virtual microphone; return once it is answered."""
        before = len(self.done)
        if text is not None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(text + "\n")
                self.proc.stdin.flush()
            except BrokenPipeError as e:
                raise AppFailed(f"the app died (its input closed) {what}\n{self.tail()}") from e
            self.wait_until(lambda: len(self.done) > before, timeout_s, what)
            return
        time.sleep(SPEAK_GAP_S)
        subprocess.run(["paplay", "--device=micfeed", str(wav)], env=env, check=True)  # returns when played
        played = time.monotonic()

        def answered() -> bool:  # every turn heard is done, and nothing more of it can come
            settled = time.monotonic() - played >= SETTLE_S
            return len(self.done) > before and self.heard <= set(self.done) and settled

        self.wait_until(answered, timeout_s, what)

    def stop(self) -> list[str]:
        """SIGINT, as Ctrl-C; returns what went wrong at the exit (status, traceback)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return ["the app did not stop within 60 s of SIGINT"]
        self.reader.join(10)
        problems = [] if self.proc.returncode == 0 else [f"the app exited with status {self.proc.returncode}"]
        if "Traceback" in self.stderr_path.read_text(errors="replace"):
            problems.append(f"a traceback on the app's stderr ({self.stderr_path})")
        return problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """Sample name -> value, labels summed (``assistant_turns_total`` over both kinds)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def rss_bytes(pid: int) -> int:
    """VmRSS of ``pid`` from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def read_records(log: Path) -> list[dict]:
    text = log.read_text() if log.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def sample(app: App, turn: int, port: int, log: Path, gpu: GpuMonitor, t0: float) -> dict:
    """One reading while the app is idle; the scrape is retried until its turn count settles."""
    records = len(read_records(log))
    for _ in range(20):  # the counter follows the log line by a few statements: wait for it
        metrics = scrape(port)
        if metrics.get("assistant_turns_total", 0) == records:
            break
        time.sleep(0.1)
    reading = gpu.sample() if gpu.available else None
    return {
        "turn": turn,
        "t_s": round(time.monotonic() - t0, 1),
        "rss_bytes": rss_bytes(app.proc.pid),
        "metrics_rss_bytes": metrics.get("process_resident_memory_bytes"),
        "gpu_used_bytes": reading.memory_used_bytes if reading else None,
        "kv_cache_tokens": metrics.get("assistant_kv_cache_tokens"),
        "metrics_turns": int(metrics.get("assistant_turns_total", 0)),
        "log_records": records,
    }


def schedule(turns: int, typed_ratio: float) -> list[bool]:
    """Which turns are spoken (True), spread evenly: ratio 0.75 speaks every 4th."""
    share = 1.0 - typed_ratio + 1e-9  # 1 - 0.8 is 0.19999999999999996
    return [int((i + 1) * share) > int(i * share) for i in range(turns)]


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    app_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="app flags go after --")
    p.add_argument("--turns", type=int, default=200, help="questions to ask (default 200)")
    p.add_argument("--typed-ratio", type=float, default=0.75, help="share of typed turns, 0-1 (default 0.75)")
    p.add_argument("--sample-every", type=int, default=10, metavar="K", help="turns between samples (10)")
    p.add_argument("--warmup-share", type=float, default=0.25, help="first share of turns not fitted (0.25)")
    p.add_argument("--max-growth-mb", type=float, default=20.0, help="per 100 turns, RSS or GPU (20)")
    p.add_argument("--turn-timeout-s", type=float, default=120.0, help="per turn (120)")
    p.add_argument("--start-timeout-s", type=float, default=300.0, help="until the app listens (300)")
    p.add_argument("--work", type=Path, help="folder for the turn log and the app's output (default: temp)")
    p.add_argument("--json", type=Path, help="write the report here")
    args = p.parse_args(argv)
    if not 0.0 <= args.typed_ratio <= 1.0 or not 0.0 <= args.warmup_share < 1.0:
        p.error("--typed-ratio must be within 0-1 and --warmup-share within 0-1 (exclusive)")
    fitted = args.turns - report_.warmup_turns(args.turns, args.warmup_share)
    if args.sample_every < 1 or fitted // args.sample_every < 2:
        p.error(
            f"{fitted} turns after the warm-up give fewer than 3 samples: "
            "raise --turns or lower --sample-every"
        )
    return args, app_args


def start_audio() -> dict[str, str]:
    out = subprocess.run([str(ROOT / "scripts/virtual-audio.sh"), "start"], capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"error: the virtual sound devices did not start: {out.stderr.strip()}")
    return {**os.environ, **dict(kv.split("=", 1) for kv in out.stdout.split()[1:])}


def run(args: argparse.Namespace, app_args: list[str]) -> dict:
    """Start the app, ask every question, sample; the report (``errors`` when it stopped early)."""
    env = start_audio()
    load_start = os.getloadavg()
    git = ["git", "-C", str(ROOT), "describe", "--always", "--dirty"]  # the code this run runs
    version = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    work = args.work or Path(tempfile.mkdtemp(prefix="soak-"))
    work.mkdir(parents=True, exist_ok=True)
    log = work / "turns.jsonl"
    log.unlink(missing_ok=True)
    spoken = schedule(args.turns, args.typed_ratio)
    wavs: dict[tuple[int, int], Path] = {}
    for j in range(sum(spoken)):  # rendered before the app starts: espeak-ng does not load it
        key = (j % len(SPOKEN), j % len(VOICES))
        if key not in wavs:
            voice, wpm = VOICES[key[1]]
            speak(SPOKEN[key[0]], work, f"q{key[0]}-{key[1]}", speed_wpm=wpm, voice=voice)
            wavs[key] = work / f"q{key[0]}-{key[1]}.wav"
    port = free_port()
    cmd = [sys.executable, "-m", "assistant", "run", "--no-tui", "--metrics-port", str(port)]
    cmd += ["--log", str(log)]
    app = App(cmd + app_args, env, work)
    gpu = GpuMonitor()
    samples: list[dict] = []
    errors: list[str] = []
    t0 = time.monotonic()
    asked = 0
    try:
        app.wait_until(
            lambda: any("listening on" in line for line in app.lines), args.start_timeout_s, "at start"
        )
        t0 = time.monotonic()
        samples.append(sample(app, 0, port, log, gpu, t0))
        n_spoken = 0
        for i, is_spoken in enumerate(spoken):
            what = f"to turn {i + 1} ({'spoken' if is_spoken else 'typed'})"
            if is_spoken:
                wav = wavs[(n_spoken % len(SPOKEN), n_spoken % len(VOICES))]
                n_spoken += 1
                app.ask(None, wav, env, args.turn_timeout_s, what)
            else:
                app.ask(TYPED[(i - n_spoken) % len(TYPED)], None, env, args.turn_timeout_s, what)
            asked = i + 1
            if asked % args.sample_every == 0 or asked == args.turns:
                samples.append(s := sample(app, asked, port, log, gpu, t0))
                print(
                    f"turn {asked}/{args.turns}: RSS {s['rss_bytes'] / 1e6:.1f} MB, KV cache "
                    f"{s['kv_cache_tokens']:.0f} tokens, /metrics {s['metrics_turns']} turns, "
                    f"log {s['log_records']}",
                    file=sys.stderr,
                    flush=True,
                )
    except AppFailed as e:
        errors.append(str(e))
    except OSError as e:  # /metrics did not answer (the app is going down?)
        errors.append(f"reading the app's /metrics or /proc failed after turn {asked}: {e}\n{app.tail()}")
    finally:
        duration_s = time.monotonic() - t0
        errors += app.stop()
    if app.losses:
        errors.append(f"the app reported {len(app.losses)} audio device losses, first: {app.losses[0]}")
    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "load_avg_start": load_start}
    machine["git"] = version  # read at the start: commits made while it ran are not in it
    return build_report(args, app_args, cmd, work, log, spoken[:asked], samples, errors, duration_s, machine)


def build_report(args, app_args, cmd, work, log, spoken, samples, errors, duration_s, machine) -> dict:
    records = read_records(log)
    warm, trim = report_.fit_start(samples, args.turns, args.warmup_share)
    turns = [s["turn"] for s in samples]
    growth = {
        "rss": report_.growth(turns, [s["rss_bytes"] for s in samples], warm),
        "gpu_memory": report_.growth(turns, [s["gpu_used_bytes"] for s in samples], warm),
    }
    cancelled = Counter(r["cancelled"] for r in records if r["cancelled"])
    after_warm = next((s for s in samples if s["turn"] >= warm), samples[-1] if samples else None)
    return {
        "command": shlex.join(["python", "-m", "bench.soak", *sys.argv[1:]]),
        "app_command": shlex.join(["assistant", *cmd[3:], *app_args]),
        "config": {k: v for k, v in vars(args).items() if k not in ("json", "work")},
        "machine": machine | {"load_avg_end": os.getloadavg()},
        "backend": sorted({r["backend"] for r in records}),
        "work": str(work),
        "duration_s": round(duration_s, 1),
        "counts": {
            "asked": len(spoken),
            "spoken": sum(spoken),
            "typed": len(spoken) - sum(spoken),
            "records": len(records),
            "metrics_turns": samples[-1]["metrics_turns"] if samples else 0,
            "no_words": cancelled.get("no words recognised", 0),
            "cut": {k: v for k, v in cancelled.items() if k in report_.CUT_REASONS},
            # ALSA's lines on the app's stderr: a playback callback ran late (a busy machine)
            "underruns": (work / "app-stderr.txt").read_text(errors="replace").count("underrun occurred"),
        },
        "samples": samples,
        "fit_from_turn": warm,
        "first_trim_turn": trim,
        "rss_fit_start_mb": (after_warm["rss_bytes"] / report_.MB) if after_warm else 0.0,
        "growth": {k: (vars(g) if g else None) for k, g in growth.items()},
        "latency": {k: report_.latency(records, k) for k in report_.LATENCIES},
        "drift": {k: report_.drift(records, k) for k in report_.LATENCIES},
        "trims": report_.trims(records),
        "errors": errors,
        "turns": [
            {
                "turn_id": r["turn_id"],
                "spoken": r["metrics"].get("endpointing_ms") is not None,
                "transcript": r["transcript"],
                "cancelled": r["cancelled"],
                "prompt_tokens": r["prompt_tokens"],
                **{k: r["metrics"].get(k) for k in report_.LATENCIES},
            }
            for r in records
        ],
    }


def main(argv: list[str] | None = None) -> int:
    args, app_args = parse_args(sys.argv[1:] if argv is None else argv)
    result = run(args, app_args)
    problems = report_.failures(result, args.max_growth_mb)
    result["failures"], result["passed"] = problems, not problems
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if result["samples"]:
        print(report_.table(result, args.max_growth_mb))
    print(f"\napp: {result['app_command']}\nlogs: {result['work']}")
    for line in problems:
        print(f"SOAK FAILED: {line}", file=sys.stderr)
    if not problems:
        print(f"soak passed: {result['counts']['asked']} turns", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

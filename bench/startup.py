"""Start-up time with warm caches: from the command to "assistant ready" / the first turn line.

Runs each checkout's ``python -m assistant`` (``--before DIR`` and ``--after DIR``, each put
first on ``PYTHONPATH``) alternately, ``--runs`` times each, and prints a table of median,
P95 and every run; ``--json FILE`` writes the same. One warm-up run of each is not counted
(it fills the page cache and the model caches).

Each checkout gets its own store (``--stores DIR``: ``DIR/before``, ``DIR/after``), whose model
folders link to the files of the user's store: the ONNX export is keyed by the code that
builds it, so two checkouts sharing one store would replace each other's export every run.

    python -m bench.startup --before /work/wt-before --after . --runs 3 --json start.json

Modes: ``chat`` (``assistant chat < /dev/null`` until "assistant ready"), ``live``
(``assistant run --no-tui`` on the virtual devices of ``scripts/virtual-audio.sh`` until
"listening on"), ``ui`` (``assistant`` in a 120x40 pseudo-terminal on the same devices, until
its status bar says LISTENING) and ``run`` (``assistant run --no-tui --input q.wav --output
r.wav`` until its first line on stdout, the turn's transcript; ``q.wav`` is made with
espeak-ng and sox).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import shlex
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

READY = {"chat": "assistant ready", "live": "listening on"}  # the line each mode is ready at
UI_READY = b"LISTENING"  # the UI's status bar once the microphone is open
UI_SIZE = (40, 120)  # rows, columns of the pseudo-terminal
UI_TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parents[1]  # the source checkout: scripts/virtual-audio.sh


def question_wav(folder: Path) -> Path:
    """``q.wav``: a spoken question, 16 kHz mono (espeak-ng, then sox without dither)."""
    raw, out = folder / "q-raw.wav", folder / "q.wav"
    subprocess.run(["espeak-ng", "-s", "160", "-w", str(raw), "What is the capital of France?"], check=True)
    subprocess.run(["sox", "-D", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True)
    return out


def link_store(source: Path, dest: Path) -> Path:
    """A store at ``dest`` whose model files are symbolic links into ``source`` (no caches)."""
    for folder in sorted(
        p for p in (source / "models").iterdir() if p.is_dir() and not p.name.startswith(".")
    ):
        target = dest / "models" / folder.name
        target.mkdir(parents=True, exist_ok=True)
        for f in folder.iterdir():
            if f.is_file() and not (target / f.name).exists():
                (target / f.name).symlink_to(f)
    return dest


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) the process has used so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_once(
    checkout: Path,
    store: Path,
    mode: str,
    wav: Path,
    out_dir: Path,
    audio_env: dict[str, str],
    extra: tuple[str, ...] = (),
    own_env: dict[str, str] | None = None,
) -> tuple[float, float]:
    """Seconds from starting the command to its ready line, and the CPU seconds it used by then.

    The CPU time is the work done, whatever else runs on the machine; the wall time is what a
    user waits, and grows with the load. The process is stopped at its ready line.
    """
    args = {
        "ui": [],  # the default command: the UI on the devices
        "chat": ["chat"],
        "live": ["run", "--no-tui"],  # the live loop on the virtual devices, until it listens
        "run": ["run", "--no-tui", "--input", str(wav), "--output", str(out_dir / "r.wav")],
    }[mode]
    args += ["--store", str(store), *extra]
    env = {**os.environ, **audio_env, "PYTHONPATH": str(checkout), **(own_env or {})}
    if mode == "ui":
        return time_ui(checkout, args, env)
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "assistant", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if mode in READY else subprocess.DEVNULL,
        text=True,
        cwd=checkout,
        env=env,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if mode == "run" or (mode in READY and READY[mode] in line):
                return time.monotonic() - start, cpu_seconds(proc.pid)
        raise RuntimeError(f"{checkout}: 'assistant {' '.join(args)}' ended before it was ready")
    finally:
        proc.kill()
        proc.wait()


def time_ui(checkout: Path, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """:func:`time_once` for the UI: run it in a pseudo-terminal and read its screen's bytes.

    Textual draws the status bar's state as one run of text, so LISTENING appears whole in the
    stream once the first frame after the microphone opened is written.
    """
    main_fd, tty_fd = pty.openpty()
    fcntl.ioctl(tty_fd, termios.TIOCSWINSZ, struct.pack("HHHH", *UI_SIZE, 0, 0))
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "assistant", *args],
        stdin=tty_fd,
        stdout=tty_fd,
        stderr=tty_fd,
        cwd=checkout,
        env={**env, "TERM": "xterm-256color", "COLUMNS": str(UI_SIZE[1]), "LINES": str(UI_SIZE[0])},
        start_new_session=True,
    )
    os.close(tty_fd)
    screen = b""
    try:
        while time.monotonic() - start < UI_TIMEOUT_S:
            if select.select([main_fd], [], [], 0.5)[0]:
                try:
                    chunk = os.read(main_fd, 65536)
                except OSError:  # the UI ended: its side of the terminal is closed
                    break
                screen = screen[-len(UI_READY) :] + chunk
                if UI_READY in screen:
                    return time.monotonic() - start, cpu_seconds(proc.pid)
            elif proc.poll() is not None:
                break
        raise RuntimeError(f"{checkout}: the UI did not say {UI_READY.decode()} in {UI_TIMEOUT_S:.0f} s")
    finally:
        proc.kill()
        proc.wait()
        os.close(main_fd)


def p95(values: list[float]) -> float:
    """The 95th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def awake_sink(audio_env: dict[str, str], sink: str) -> subprocess.Popen[bytes]:
    """Silence played into ``sink`` at 20 ms latency, so that the null sink never idles.

    A PulseAudio null sink with no stream sleeps in 2 s blocks. On the speaker (``spk``) a new
    stream's first sound then waits up to ~1.6 s, which holds the app's start-up echo probe; on
    the microphone's feed (``micfeed``) PortAudio's capture of its monitor spins a core until
    sound flows. A sound card's sink, or PipeWire's graph, does neither.
    """
    command = ["pacat", "--playback", "-d", sink, "--latency-msec=20", "--raw", "--format=s16le"]
    command += ["--rate=16000", "--channels=1", f"--stream-name=bench-awake-{sink}"]
    with open("/dev/zero", "rb") as zeros:
        proc = subprocess.Popen(
            command, stdin=zeros, stdout=subprocess.DEVNULL, env={**os.environ, **audio_env}
        )
    time.sleep(0.5)  # connected and playing
    if proc.poll() is not None:
        sys.exit(f"pacat ended at once (status {proc.returncode}): cannot keep {sink} awake")
    return proc


def measure(
    args: argparse.Namespace,
    checkouts: dict[str, Path],
    stores: dict[str, Path],
    audio_env: dict[str, str],
    extra: tuple[str, ...],
    envs: dict[str, dict[str, str]],
) -> dict[str, dict]:
    """Every mode's runs, printed as a table; returns the table."""
    results: dict[str, dict[str, list[float]]] = {}
    cpu_results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        wav = question_wav(Path(tmp))
        for mode in args.modes.split(","):
            runs: dict[str, list[float]] = {label: [] for label in checkouts}
            cpu: dict[str, list[float]] = {label: [] for label in checkouts}
            for label, checkout in checkouts.items():  # warm-up, not counted
                time_once(checkout, stores[label], mode, wav, Path(tmp), audio_env, extra, envs[label])
            for _ in range(args.runs):  # alternating, so load on the machine hits both alike
                for label, checkout in checkouts.items():
                    wall_s, cpu_s = time_once(
                        checkout, stores[label], mode, wav, Path(tmp), audio_env, extra, envs[label]
                    )
                    runs[label].append(wall_s)
                    cpu[label].append(cpu_s)
            results[mode] = runs
            cpu_results[mode] = cpu
    print(f"{'mode':6} {'checkout':8} {'median s':>9} {'P95 s':>7} {'CPU s':>6}  runs s")
    table = {}
    for mode, runs in results.items():
        for label, values in runs.items():
            row = {
                "median_s": statistics.median(values),
                "p95_s": p95(values),
                "runs_s": values,
                "cpu_median_s": statistics.median(cpu_results[mode][label]),
                "cpu_runs_s": cpu_results[mode][label],
            }
            table[f"{mode}/{label}"] = row
            listed = " ".join(f"{v:.2f}" for v in values)
            print(
                f"{mode:6} {label:8} {row['median_s']:9.2f} {row['p95_s']:7.2f} "
                f"{row['cpu_median_s']:6.2f}  {listed}"
            )
    return table


def main(argv: list[str] | None = None) -> int:
    """Measure, print the table, write the JSON; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout before the change")
    parser.add_argument("--after", type=Path, default=Path.cwd(), help="checkout after (default: here)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--modes",
        default="chat,run",
        help="of chat, run (file mode), live and ui (both on the virtual devices: PulseAudio)",
    )
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument(
        "--awake-speaker",
        action="store_true",
        help="keep the virtual speaker's sink awake (silence at 20 ms) as a sound card's is",
    )
    parser.add_argument(
        "--awake-microphone",
        action="store_true",
        help="keep the virtual microphone's feed awake likewise (silence: nothing is heard)",
    )
    parser.add_argument(
        "--app-args", default="", help='more arguments for every run, e.g. "--echo off" (one string)'
    )
    parser.add_argument(
        "--before-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the before runs only (repeatable): e.g. --before-env "
        "PYTHONDONTWRITEBYTECODE=1 with --before and --after the same checkout",
    )
    parser.add_argument("--source-store", type=Path, default=Path.home() / ".cache" / "assistant")
    parser.add_argument("--stores", type=Path, default=Path("/tmp/measure-startup-stores"))
    args = parser.parse_args(argv)
    checkouts = {"before": args.before.resolve(), "after": args.after.resolve()}
    extra = tuple(shlex.split(args.app_args))
    stores = {label: link_store(args.source_store, args.stores / label) for label in checkouts}
    audio_env: dict[str, str] = {}
    if {"live", "ui"} & set(args.modes.split(",")):  # the private PulseAudio of scripts/virtual-audio.sh
        started = subprocess.run(
            [str(ROOT / "scripts/virtual-audio.sh"), "start"], capture_output=True, text=True
        )
        if started.returncode:
            sys.exit(started.stderr)
        audio_env = dict(kv.split("=", 1) for kv in started.stdout.split()[1:])
    sinks = [name for name, on in (("spk", args.awake_speaker), ("micfeed", args.awake_microphone)) if on]
    awake: list[subprocess.Popen[bytes]] = []
    # A SIGTERM (pkill) ends the bench through the finally below, not around it: pacat left
    # playing kept a core ~7 % busy for the next hour's runs (2026-12-07).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for sink in sinks if audio_env else []:
            awake.append(awake_sink(audio_env, sink))  # one by one: a failure stops those started
        envs = {"before": dict(kv.split("=", 1) for kv in args.before_env), "after": {}}
        table = measure(args, checkouts, stores, audio_env, extra, envs)
    finally:
        for proc in awake:
            proc.kill()
            proc.wait()
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

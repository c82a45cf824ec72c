"""A stalled app on the echo rig: do replies pause for their own echo, is every question answered?

The real app (``assistant run --no-tui``) on a private PulseAudio with the echo rig (60 ms,
-13 dB, two reflections). Each typed question's reply is stalled ``--stall-ms`` (the process
held with SIGSTOP) ``--after-s`` into its audio, as a machine that stalls does: the speaker
underruns, the microphone's backlog comes in a burst and the echo path moves for seconds.
Counts the questions answered, the replies paused for speech that was only their echo (and
those never resumed), and the app's half-duplex notices by cause. Prints a table, writes
``--json``:

    python -m bench.stalls --stalls 8 --json docs/results/stalls.json
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.duplex_rig import LiveApp
from bench.echo_rig import echo_path, private_audio
from bench.results import write_results

CAUSES = {"ran late": "xrun", "blocks came": "stalled microphone", "echo path moved": "echo path moved"}


def run(env: dict[str, str], folder: Path, stalls: int, stall_ms: float, after_s: float) -> dict:
    """``stalls`` questions, each reply stalled once; what the app did."""
    app = LiveApp(env, folder, "--max-new-tokens", "24")
    try:
        app.wait_line("listening on", 300)
        for i in range(stalls):
            mark = len(app.events())
            app.ask(f"Tell me one fact about the number {i + 1}.")
            try:
                app.wait_event("AudioStarted", after=mark, timeout_s=60)
            except AssertionError:
                break  # the app holds an earlier reply: the later questions wait behind it
            time.sleep(after_s)
            os.kill(app.proc.pid, signal.SIGSTOP)
            time.sleep(stall_ms / 1000)
            os.kill(app.proc.pid, signal.SIGCONT)
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and sum(e["event"] == "TurnDone" for e in app.events()) <= i:
                time.sleep(0.2)
    finally:
        app.stop()
    events = app.events()
    kinds = Counter(e["event"] for e in events)
    notices = [e["reason"] for e in events if e["event"] == "EchoState" and not e["full_duplex"]]
    causes = Counter(next((c for key, c in CAUSES.items() if key in r), "start") for r in notices)
    return {
        "questions": stalls,
        "answered": kinds["TurnDone"],
        "paused": kinds["ReplyPaused"],
        "never resumed": kinds["ReplyPaused"] - kinds["ReplyResumed"] - kinds["BargeIn"],
        "half duplex": dict(causes),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalls", type=int, default=8, help="questions, each reply stalled once")
    parser.add_argument("--stall-ms", type=float, default=300)
    parser.add_argument("--after-s", type=float, default=0.8, help="into the reply's audio")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    with private_audio("stalls-pulse-") as env, echo_path(env, 60, -13, 2):
        result = run(env, Path(tempfile.mkdtemp(prefix="stalls-")), args.stalls, args.stall_ms, args.after_s)
    head = ("questions", "answered", "paused", "never resumed")
    print("| " + " | ".join(head) + " | half duplex (cause: times) |")
    print("|" + "---:|" * len(head) + "---|")
    causes = ", ".join(f"{c}: {n}" for c, n in sorted(result["half duplex"].items()))
    print("| " + " | ".join(str(result[k]) for k in head) + f" | {causes} |")
    if args.json:
        write_results(args.json, args, result=result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Full duplex on the echo rig: false barge-ins, barge-in reaction, words kept, ERLE, CPU per frame.

Each configuration runs the real app (``assistant run --no-tui``) on the private PulseAudio of
``scripts/virtual-audio.sh`` with the speaker fed back into the microphone (``--delay-ms``,
``--gain-db``, two reflections; ``bench.echo_rig``), in three parts:

1. echo only: ``--replies`` typed questions answered aloud, nobody speaking: every pause of a
   reply, barge-in or speech heard is a false one (per 100 replies), ERLE per reply;
2. barge-in: a long question, then ``What is the capital of Germany?`` spoken 2.6 s into its
   reply: the reaction (reply paused or stopped, minus the speech's onset), and whether the
   new question was answered;
3. paused questions: the first half, the reply starts, 0.2 s later the second half: the share
   of the second half's words in no transcript (words lost), and voice-to-voice of the answer;
4. backchannels: a long question, then "Uh-huh.", "Okay.", "Right.", "Yeah." or "Mm-hmm." 1.0 s
   into its reply (inside the continuation window; ``--backchannels`` picks others,
   ``--backchannel-at`` another time: 2.6 is after the window): how long the reply stayed
   paused, and whether it was cut instead of resumed.

``--parts`` runs some of them (default all). The spoken parts' replies are ``--max-new-tokens``
long (default 60; the app's own default, 160, keeps generating while the user speaks over them).

``before`` is a checkout of the code before full duplex (``--before DIR``, its own venv), run
with ``--barge-in`` in part 1 and 2 (without it nothing is heard over a reply at all). Prints
markdown tables (median and P95) and writes ``--json``.

    python -m bench.duplex --before /work/baseline --json docs/results/duplex-14.json
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.duplex_rig import LiveApp, next_turn, reply_playing, settle, utterance
from bench.echo_rig import echo_path, private_audio
from bench.results import write_results

PAUSED = [  # (first half, second half)
    ("I would like to know", "how many days are in a week?"),
    ("What is the largest,", "the largest ocean on Earth?"),
    ("Can you tell me", "the name of the closest star?"),
    ("How many legs", "does a spider have?"),
]


BACKCHANNELS = ("Uh-huh.", "Okay.", "Right.", "Yeah.", "Mm-hmm.")
PARTS = ("echo", "barge", "paused", "backchannel")


def norm(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9 ]", " ", text.lower()).split()


def words_lost(said: str, heard: str) -> list[str]:
    """The words of ``said`` missing from ``heard`` (as :func:`norm` splits them)."""
    kept = set(norm(heard))
    return [w for w in norm(said) if w not in kept]


class App(LiveApp):
    """:class:`LiveApp` from another checkout (its own venv) when ``checkout`` is given."""

    def __init__(self, env: dict[str, str], folder: Path, checkout: Path | None, *args: str) -> None:
        if checkout is None:
            super().__init__(env, folder, *args)
            return
        python = checkout / ".venv" / "bin" / "python"
        real = sys.executable
        sys.executable = str(python)  # LiveApp starts "sys.executable -m assistant"
        cwd = Path.cwd()
        os.chdir(checkout)
        try:
            super().__init__(env, folder, *args)
        finally:
            sys.executable = real
            os.chdir(cwd)


def echo_only(
    env: dict, folder: Path, checkout: Path | None, replies: int, flags: list[str], tokens: int = 10
) -> dict:
    """``replies`` typed questions answered aloud in ``tokens``-token replies; nobody speaks.

    Short replies (10 tokens) are many replies in little time; long ones (160, the app's
    default) play while the rest of the reply is still being generated, on the same cores.
    """
    app = App(env, folder, checkout, "--max-new-tokens", str(tokens), *flags)
    question = "Name a colour, number {}." if tokens <= 10 else "Tell me about the history of city number {}."
    try:
        app.wait_line("listening on", 300)
        for i in range(replies):
            app.ask(question.format(i + 1))
        deadline = time.monotonic() + 60 + (8 + tokens // 4) * replies
        while sum(e["event"] == "TurnDone" for e in app.events()) < replies and time.monotonic() < deadline:
            time.sleep(0.3)
    finally:
        app.stop()
    events = app.events()
    done = sum(e["event"] == "TurnDone" for e in events)
    false = sum(e["event"] in ("ReplyPaused", "BargeIn") for e in events)
    heard = sum(e["event"] == "SpeechStarted" for e in events)
    erle = [e["erle_db"] for e in events if e["event"] == "EchoMeasured" and e.get("erle_db") is not None]
    return {"replies": done, "false_interruptions": false, "speech_heard": heard, "erle_db": erle}


def talk_result(trials: int) -> dict:
    """What the spoken parts fill in; ``failed``: trials whose reply never came (the app's output)."""
    return {"trials": trials, "reactions_ms": [], "answered": 0, "words_lost": [], "v2v_ms": []} | {
        "backchannel_paused_ms": [],
        "backchannel_cut": [],
        "failed": [],
    }


def spoken(
    env: dict,
    folder: Path,
    checkout: Path | None,
    trials: int,
    flags: list[str],
    parts: tuple[Callable, ...],
    max_new_tokens: int = 60,
) -> dict:
    long_q = utterance(folder, "Tell me about the history of Paris.", "long")
    germany = utterance(folder, "What is the capital of Germany?", "germany")
    halves = [
        (utterance(folder, a, f"a{i}"), utterance(folder, b, f"b{i}"), b) for i, (a, b) in enumerate(PAUSED)
    ]
    app = App(env, folder, checkout, "--max-new-tokens", str(max_new_tokens), "--temperature", "0", *flags)
    result = talk_result(trials)
    try:
        app.wait_line("listening on", 300)
        for k in range(trials):
            for part in parts:
                try:
                    part(app, result, k, long_q, germany, halves)
                except AssertionError as e:
                    result["failed"].append(f"{part.__name__} {k}: {str(e)[:200]}")
                settle(app, timeout_s=40)
    finally:
        app.stop()
    return result


def over_its_reply(app: App, question: Path, after_s: float, speech: Path) -> tuple[int, int]:
    """Say ``question``, then ``speech`` ``after_s`` into its reply; wait until all is answered.

    Returns where this trial's events begin and the question's turn.
    """
    mark = len(app.events())
    app.say(question)
    turn = next_turn(app, mark, timeout_s=30)
    reply_playing(app, turn, mark, timeout_s=30)
    time.sleep(after_s)
    app.say(speech)
    settle(app, timeout_s=40)
    return mark, turn


def barge_in(app: App, result: dict, k: int, long_q: Path, germany: Path, _halves: list) -> None:
    """A long question; 2.6 s into its reply, a new one: the reaction, and whether it was answered."""
    mark, turn = over_its_reply(app, long_q, 2.2, germany)  # past the 1.8 s window from the first audio
    ev = [e for e in app.events()[mark:] if e["turn_id"] == turn]
    stop = next((e for e in ev if e["event"] in ("ReplyPaused", "BargeIn")), None)
    if stop is not None:
        result["reactions_ms"].append((stop["t_ns"] - stop["onset_t_ns"]) / 1e6)
    heard = [
        e["text"].lower()
        for e in app.events()[mark:]
        if e["event"] == "TranscriptReady" and e["turn_id"] != turn
    ]
    result["answered"] += any("germany" in text for text in heard)


def paused(app: App, result: dict, k: int, _long: Path, _germany: Path, halves: list) -> None:
    """The first half; the reply starts; 0.2 s later the second half: its words kept or lost."""
    first, rest, rest_text = halves[k % len(halves)]
    mark, turn = over_its_reply(app, first, 0.2, rest)
    texts = [e["text"] for e in app.events()[mark:] if e["event"] == "TranscriptReady"]
    first_words = set(norm(PAUSED[k % len(PAUSED)][0]))
    # The question answered: the transcript holding the most of the first half's words.
    ranked = [(len(first_words & set(norm(t))), i) for i, t in enumerate(texts)]  # the later on ties
    asked = texts[max(ranked)[1]] if texts else ""
    words = set(norm(rest_text))
    result["words_lost"].append(len(words - set(norm(asked))) / len(words))
    recs = [r for t, r in app.records().items() if t >= turn and r["transcript"] == asked]
    v2v = recs[-1]["metrics"].get("voice_to_voice_ms") if recs and not recs[-1]["cancelled"] else None
    if v2v is not None:
        result["v2v_ms"].append(v2v)


def backchannel_part(phrases: tuple[str, ...], at_s: float) -> Callable:
    """Part 4 with these backchannels, one per trial in turn, ``at_s`` into the reply."""

    def backchannel(app: App, result: dict, k: int, long_q: Path, _germany: Path, _halves: list) -> None:
        """A long question; ``at_s`` into its reply a backchannel: how long the reply holds, or is it cut."""
        text = phrases[k % len(phrases)]
        wav = utterance(long_q.parent, text, f"backchannel{k % len(phrases)}")
        mark, turn = over_its_reply(app, long_q, at_s, wav)
        ev = [e for e in app.events()[mark:] if e["turn_id"] == turn]
        resumed = [e["paused_ms"] for e in ev if e["event"] == "ReplyResumed"]
        heard = [f"{e['text']!r} ({e['verdict']})" for e in ev if e["event"] == "OverlapHeard"]
        cancelled = app.records().get(turn, {}).get("cancelled", "")
        ended = next((e["t_ns"] for e in ev if e["event"] == "PlaybackEnded"), None)
        later = [e for e in app.events()[mark:] if e["event"] == "SpeechOnset" and e["turn_id"] > turn]
        onsets = [e["t_ns"] for e in later]
        if not resumed and not cancelled and ended is not None and any(t > ended for t in onsets):
            # a reply shorter than ``at_s`` (after a cut one, SmolLM2 may repeat its few words)
            result["failed"].append(f"backchannel {k}: {text} began after the reply ended")
        elif cancelled:
            result["backchannel_cut"].append(f"{text} heard as {', '.join(heard)}: {cancelled}")
        elif resumed:  # the backchannel's pause (a long reply may pause again later, for its echo)
            result["backchannel_paused_ms"].append(resumed[0])

    return backchannel


def cpu_per_frame() -> dict:
    """The capture path's echo cancellation per 10 ms frame (far end fed, resampled, processed)."""
    from assistant.config.sections import EchoOptions
    from assistant.stages.echo import EchoCanceller, load_processor

    options = EchoOptions()
    canceller = EchoCanceller(options, load_processor(options))
    rng = np.random.default_rng(0)
    far = (0.1 * rng.standard_normal(16000 * 20)).astype(np.float32)
    near = np.roll(far, 960) * 0.2
    t0, block = 10**12, 512
    start = time.process_time()
    for i in range(0, far.size - block, block):
        t = t0 + i * 62_500
        canceller.play(far[i : i + 2 * block], t)  # as the speaker's callback: a block ahead
        canceller.process(near[i : i + block], t)
    frames = far.size // 160
    return {"cpu_ms_per_frame": 1000 * (time.process_time() - start) / frames, "frames": frames}


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def per_100(echo: dict) -> float:
    return 100 * echo["false_interruptions"] / max(echo["replies"], 1)


def table(results: dict) -> str:
    rows = [
        "| | " + " | ".join(results) + " |",
        "|---|" + "---:|" * len(results),
    ]

    def row(label: str, fn: Callable[[dict], str]) -> None:
        rows.append(f"| {label} | " + " | ".join(fn(r) for r in results.values()) + " |")

    def f(v: float | None, d: int = 0) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    row("replies with echo only", lambda r: str(r["echo"]["replies"]))
    row("false interruptions per 100 replies", lambda r: f(per_100(r["echo"]), 1))
    row("speech heard in echo-only replies", lambda r: str(r["echo"]["speech_heard"]))
    row("ERLE median (dB)", lambda r: f(pct(r["echo"]["erle_db"], 50), 1))
    row("barge-in reaction median (ms)", lambda r: f(pct(r["spoken"]["reactions_ms"], 50)))
    row("barge-in reaction P95 (ms)", lambda r: f(pct(r["spoken"]["reactions_ms"], 95)))
    row("barge-ins stopped / tried", lambda r: f"{len(r['spoken']['reactions_ms'])}/{r['spoken']['trials']}")
    row("trials with no reply to speak over", lambda r: str(len(r["spoken"]["failed"])))
    row("new question answered", lambda r: f"{r['spoken']['answered']}/{r['spoken']['trials']}")
    row(
        "second-half words lost (paused)",
        lambda r: f(100 * float(np.mean(lost))) + " %" if (lost := r["spoken"]["words_lost"]) else "-",
    )
    row("voice-to-voice median (ms)", lambda r: f(pct(r["spoken"]["v2v_ms"], 50)))
    row("voice-to-voice P95 (ms)", lambda r: f(pct(r["spoken"]["v2v_ms"], 95)))
    row("backchannel: reply paused median (ms)", lambda r: f(pct(r["spoken"]["backchannel_paused_ms"], 50)))
    row("backchannel: reply paused P95 (ms)", lambda r: f(pct(r["spoken"]["backchannel_paused_ms"], 95)))
    row(
        "backchannels that paused / cut the reply",
        lambda r: f"{len(r['spoken']['backchannel_paused_ms'])} / {len(r['spoken']['backchannel_cut'])}",
    )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before (with its .venv)")
    parser.add_argument("--replies", type=int, default=20)
    parser.add_argument(
        "--echo-tokens", type=int, default=10, help="part 1's reply length (160: the app's default)"
    )
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--delay-ms", type=int, default=60)
    parser.add_argument("--gain-db", type=float, default=-13)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"of {', '.join(PARTS)}")
    parser.add_argument(
        "--backchannels", default=",".join(BACKCHANNELS), help="part 4's phrases, comma-separated, in turn"
    )
    parser.add_argument(
        "--backchannel-at", type=float, default=1.0, help="seconds into the reply part 4's phrase begins"
    )
    parser.add_argument("--max-new-tokens", type=int, default=60, help="the spoken parts' reply length")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    phrases = tuple(p.strip() for p in args.backchannels.split(",") if p.strip())
    if unknown := set(parts) - set(PARTS):
        parser.error(f"--parts: no such part {', '.join(sorted(unknown))} (of {', '.join(PARTS)})")
    # name -> (checkout, flags for echo only, for barge-ins, for paused questions). The code
    # before full duplex hears nothing over a reply without --barge-in, so its barge-ins (and
    # its echo-only run: would it interrupt itself?) use it; its paused questions run as a user
    # gets it, by default.
    configs: dict[str, tuple[Path | None, list[str], list[str], list[str]]] = {"new": (None, [], [], [])}
    if args.before:
        configs = {"before": (args.before, ["--barge-in"], ["--barge-in"], []), **configs}
    results: dict[str, dict] = {}
    with private_audio("duplex-pulse-") as env, echo_path(env, args.delay_ms, args.gain_db, 2):
        for name, (checkout, echo_flags, barge_flags, paused_flags) in configs.items():
            work = Path(tempfile.mkdtemp(prefix=f"duplex-{name}-"))
            for part in PARTS:
                (work / part).mkdir()
            echo = {"replies": 0, "false_interruptions": 0, "speech_heard": 0, "erle_db": []}
            if "echo" in parts:
                print(f"{name}: echo only, {args.replies} replies", file=sys.stderr)
                echo = echo_only(env, work / "echo", checkout, args.replies, echo_flags, args.echo_tokens)
            talk = talk_result(args.trials)
            for part, flags, fn, keys in (
                ("barge", barge_flags, barge_in, ("reactions_ms", "answered")),
                ("paused", paused_flags, paused, ("words_lost", "v2v_ms")),
                (
                    "backchannel",
                    paused_flags,
                    backchannel_part(phrases, args.backchannel_at),
                    ("backchannel_paused_ms", "backchannel_cut"),
                ),
            ):
                if part in parts:
                    print(f"{name}: {args.trials} trials of {part}", file=sys.stderr)
                    run = spoken(env, work / part, checkout, args.trials, flags, (fn,), args.max_new_tokens)
                    talk |= {k: run[k] for k in keys}
                    talk["failed"] += run["failed"]
            results[name] = {"echo": echo, "spoken": talk}
    cpu = cpu_per_frame()
    print(table(results))
    print(
        f"\necho cancellation CPU: {cpu['cpu_ms_per_frame']:.3f} ms per 10 ms frame ({os.cpu_count()} cores)"
    )
    if args.json:
        write_results(args.json, args, cpu=cpu, results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

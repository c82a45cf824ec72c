"""Stop requests over a playing reply: how often "Stop." and its kin stop it.

The real app (``assistant run --no-tui``) on a private PulseAudio (``scripts/virtual-audio.sh``):
a long question, then, 2.6 s into its reply (past the continuation window), a stop phrase
into the microphone. A trial counts as **stopped** when the reply was stopped (``BargeIn`` on
its turn) and no new turn was answered; **answered** when the phrase became a turn of its own
that got a reply; **played on** otherwise. A reply that ended before the phrase began is no
trial (**reply over**). Each trial runs in an app of its own, so every question opens a fresh
conversation (in one long conversation SmolLM2's replies grew too short to speak over). Two rooms:
``headset`` (the speaker does not reach the microphone) and ``speakers`` (the echo rig:
``--delay-ms``, ``--gain-db``, two reflections). Extra ``section.key=value`` settings go in
as ``ASSISTANT_SECTION_KEY`` (``--set echo.residual_gate_db=40``). Prints a table, writes ``--json``
(with what the app heard over each reply: ``OverlapHeard`` text and verdict):

    python -m bench.stop_requests --trials 3 --json docs/results/stop-requests.json

``--piper-wpm 210`` says the phrases in the bundled Piper voice at that rate (espeak-ng's
otherwise; the question stays espeak-ng's).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from bench.duplex_rig import LiveApp, next_turn, piper_utterance, reply_playing, settle, utterance
from bench.echo_rig import echo_path, private_audio
from bench.results import write_results

PHRASES = ["Stop.", "Stop talking.", "Please stop.", "Wait."]
AFTER_WINDOW_S = 2.6


def trial(app: LiveApp, question: Path, phrase: Path) -> tuple[str, list[str]]:
    """One long question and a stop phrase over its reply: stopped, answered or played on.

    Also what the app heard over the reply (``OverlapHeard``: text and verdict).
    """
    mark = len(app.events())
    app.say(question)
    turn = next_turn(app, mark, timeout_s=60)
    reply_playing(app, turn, mark, timeout_s=60)
    time.sleep(AFTER_WINDOW_S)
    app.say(phrase)
    settle(app, timeout_s=60)
    events = app.events()[mark:]
    ended = [e["t_ns"] for e in events if e["event"] == "PlaybackEnded" and e["turn_id"] == turn]
    onsets = [e["onset_t_ns"] for e in events if e["event"] == "SpeechOnset" and e["turn_id"] > turn]
    heard = [f"{e['text']!r}: {e['verdict']}" for e in events if e["event"] == "OverlapHeard"]
    if ended and (not onsets or ended[0] < onsets[0]):
        return "reply over", heard  # the reply ended before the phrase began: not a trial
    stopped = any(e["event"] == "BargeIn" and e["turn_id"] == turn for e in events)
    answered = any(e["event"] == "SentenceReady" and e["turn_id"] > turn for e in events)
    return "answered" if answered else "stopped" if stopped else "played on", heard


def room(
    env: dict,
    folder: Path,
    trials: int,
    settings: dict[str, str],
    heard: dict[str, list[list[str]]],
    said: list[str],
    piper_wpm: int = 0,
) -> dict[str, list[str]]:
    """``trials`` of each phrase, each in an app of its own (a fresh conversation: long replies).

    ``piper_wpm``: the phrases in the Piper voice at that rate (0: espeak-ng).
    """
    question = utterance(folder, "Tell me about the history of Paris.", "question")
    phrases = {}
    for i, p in enumerate(said):
        name = f"phrase{i}"
        phrases[p] = piper_utterance(folder, p, name, piper_wpm) if piper_wpm else utterance(folder, p, name)
    outcomes: dict[str, list[str]] = {p: [] for p in said}
    for n in range(trials):
        for i, (text, wav) in enumerate(phrases.items()):
            run = folder / f"trial{n}-{i}"
            run.mkdir()
            app = LiveApp({**env, **settings}, run, "--max-new-tokens", "80", "--temperature", "0")
            try:
                app.wait_line("listening on", 300)
                outcome, words = trial(app, question, wav)
                outcomes[text].append(outcome)
                heard.setdefault(text, []).append(words)
            except AssertionError as e:
                outcomes[text].append(f"failed: {str(e)[:80]}")
            finally:
                app.stop()
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3, help="trials of each phrase in each room")
    parser.add_argument("--delay-ms", type=int, default=60)
    parser.add_argument("--gain-db", type=float, default=-13)
    parser.add_argument("--rooms", default="headset,speakers")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--phrases", default="|".join(PHRASES), help="the phrases said, '|' between them")
    parser.add_argument("--piper-wpm", type=int, default=0, help="the phrases in Piper's voice at this rate")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    settings = {}
    for item in args.set:
        key, value = item.split("=", 1)
        settings["ASSISTANT_" + key.replace(".", "_").upper()] = value
    said = args.phrases.split("|")
    results: dict[str, dict[str, list[str]]] = {}
    heard: dict[str, dict[str, list[list[str]]]] = {}
    with private_audio("stop-pulse-") as env:
        for name in args.rooms.split(","):
            print(f"{name}: {args.trials} trials of {len(said)} phrases", file=sys.stderr)
            rig = echo_path(env, args.delay_ms, args.gain_db, 2) if name == "speakers" else nullcontext()
            with rig:
                folder = Path(tempfile.mkdtemp(prefix=f"stop-{name}-"))
                results[name] = room(
                    env, folder, args.trials, settings, heard.setdefault(name, {}), said, args.piper_wpm
                )
    kinds = ("stopped", "answered", "played on", "reply over")
    print("| phrase | " + " | ".join(f"{r}: " + " / ".join(kinds) for r in results) + " |")
    print("|---|" + "---:|" * len(results))
    for phrase in said:
        cells = []
        for outcomes in results.values():
            got = outcomes[phrase]
            cells.append(" / ".join(str(got.count(k)) for k in kinds))
        print(f"| {phrase} | " + " | ".join(cells) + " |")
    if args.json:
        write_results(args.json, args, results=results, heard=heard)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

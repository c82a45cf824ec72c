"""A lone "Stop." (or other words) over a reply's echo, in closed loop: what the judge makes of it.

The app's capture path without its threads or devices (real AEC3, Silero VAD, tiny.en and the
overlap judge, ``Hearing.transcribe_overlap``), on a reply and the word spoken by espeak-ng in
four voices (``--piper``: the Piper voice at four rates), the word 2.0-4.0 s into the reply
(after the continuation window: judged alone). The reply's echo reaches the microphone as on
the echo rig (60 ms, -13 dB, a reflection 23 ms later at -19 dB), optionally with the rig's clock
drift. The reply stops ``pause_ms`` after the endpointer's ``SpeechOnset`` (the app: ~15-50 ms
to carry out the pause plus the output buffer, 64 ms), which needs ``onset_ms`` of speech
(the app's default 96). Each setting prints how often the judge heard a stop request and how
long the echo sounded after the word began (the live app on the rig: 420-560 ms):

    python -m bench.stop_closed_loop --settings 96:100,32:50,32:20 --json docs/results/stop-closed-loop.json

``--words`` judges other words too ("Go on.", "Okay."): each word's verdicts are counted.
``--views linear,aec3`` runs each trial with what the judge hears beside the gated speech as
the app has it (the echo removed by a linear fit alone) and as it had it before (AEC3's output
before the residual gate). The echo's delay drifts by a fraction of a sample as the rig's
loopback resamples. ``--thresholds 0.5,0.4`` runs each trial with the VAD's threshold over
the reply at each value (the app's ``over_reply_threshold``; 0.5 is ``threshold``, the only
one before 2026-12-07).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import soundfile

from assistant.config import ModelSettings
from assistant.config.sections import EchoOptions, VadOptions
from assistant.events import OnsetEnded, OverlapVerdict, SpeechOnset, SpeechPaused
from assistant.stages.asr import AsrOptions, Transcriber
from assistant.stages.echo import Cancelled, EchoCanceller, load_processor
from assistant.stages.echo_linear import AudioTail, EchoTrack, fractional_read
from assistant.stages.vad import SAMPLE_RATE_HZ, Endpointer
from assistant.turns.hearing import Hearing
from assistant.turns.overlap_words import judge
from bench.corpus import ECHO_REPLY as REPLY
from bench.duplex_rig import piper_speech, utterance
from bench.results import write_results
from store.bundled import ModelStore

VOICES: dict[str, dict[str, Any]] = {
    "us": {},
    "fast": {"speed_wpm": 200},
    "gb": {"voice": "en-gb"},
    "slow": {"speed_wpm": 130},
}
PIPER_RATES = {"piper-150": 150, "piper-175": 175, "piper-210": 210, "piper-240": 240}  # wpm
BLOCK = 512  # the microphone's 32 ms blocks
WARM_S = 5.0  # the reply plays this long before the first trial's window (as the probe and earlier replies)
ECHO = ((60, 10 ** (-13 / 20)), (83, 10 ** (-19 / 20)))  # (delay ms, gain) of each path


def trial(hearing: Hearing, reply: np.ndarray, word: np.ndarray, onset_s: float, onset_ms: int,
          pause_ms: int, drift: float, view: str = "linear",
          threshold: float = 0.4) -> tuple[str, float | None]:  # fmt: skip
    """What the judge heard, and how long the echo sounded after the word began (ms).

    ``view``: what the judge gets beside the gated speech: ``linear`` (the app's: the echo
    removed by a linear fit alone) or ``aec3`` (AEC3's output before the residual gate, as
    before 2026-12-07).
    """
    onset = int(onset_s * SAMPLE_RATE_HZ)
    n = onset + 2 * SAMPLE_RATE_HZ
    far = np.pad(reply, (0, max(0, n - reply.size)))[:n].copy()
    user = np.zeros(n, np.float32)
    start = onset - int(0.2 * SAMPLE_RATE_HZ)  # the WAV's 0.2 s of silence before the word
    user[start : start + word.size] = word
    mic = np.zeros(n, np.float32)
    options = EchoOptions(enabled="on")
    canceller = EchoCanceller(options, load_processor(options))
    vad = VadOptions(onset_ms=onset_ms, over_reply_threshold=threshold)
    endpointer, ungated, track = Endpointer(vad), AudioTail(10), EchoTrack(10)
    endpointer.over_reply = True  # a reply plays (or is paused) throughout
    cut: int | None = None  # the far-end sample where the reply stops
    for i in range(0, n - BLOCK + 1, BLOCK):
        add_echo(mic, far, i, ECHO, drift)
        out, t_end_ns = cancel_block(canceller, track, far, mic[i : i + BLOCK] + user[i : i + BLOCK], i)
        ungated.add(out.audio, t_end_ns)
        for event in endpointer.feed(out.vad, t_end_ns):
            if isinstance(event, SpeechOnset) and cut is None:
                cut = i + BLOCK + pause_ms * 16
                far[cut:] = 0.0  # the reply stops there
            if isinstance(event, OnsetEnded | SpeechPaused):
                if view == "aec3":
                    beside = ungated.span(event.t_ns, event.audio.size)
                else:
                    span = track.span(event.t_ns, event.audio.size)
                    beside = span.cleaned() if span is not None else None
                short = isinstance(event, OnsetEnded) or event.audio.size < SAMPLE_RATE_HZ // 2
                text = hearing.transcribe_overlap(event.audio, None, beside, short).text
                sounded = (cut + int(ECHO[-1][0] * 16) - onset) / 16 if cut is not None else None
                return text, sounded
    return "(not heard as speech)", None


def add_echo(mic: np.ndarray, far: np.ndarray, i: int, paths: tuple[tuple[int, float], ...],
             drift: float) -> None:  # fmt: skip
    """Add to ``mic``'s block at ``i`` the echo of ``far`` along each (delay ms, gain) path.

    Each delay grows with ``drift``: the rig's loopback resamples, by a fraction of a sample.
    """
    idx = np.arange(i, i + BLOCK)
    for delay_ms, gain in paths:
        src = idx - delay_ms * 16 - drift * idx
        heard = src >= 0
        mic[idx[heard]] += gain * fractional_read(far, src[heard]).astype(np.float32)


def cancel_block(canceller: EchoCanceller, track: EchoTrack, far: np.ndarray, near: np.ndarray,
                 i: int) -> tuple[Cancelled, int]:  # fmt: skip
    """The microphone's block ``near`` (at sample ``i``) through the canceller; its output's last time.

    The far end goes in a block ahead, as the speaker's callback writes it; ``track`` gets both.
    """
    t_ns = 10**12 + i * 1_000_000_000 // SAMPLE_RATE_HZ
    canceller.play(far[i : i + 2 * BLOCK], t_ns)
    track.add_far(far[i : i + BLOCK], t_ns + (BLOCK - 1) * 62_500)
    out = canceller.process(near, t_ns)
    t_end_ns = t_ns + (out.audio.size - 1) * 62_500
    track.add_near(out.near, t_end_ns)
    return out, t_end_ns


def judged(hearing: Hearing, reply: np.ndarray, words: dict[str, np.ndarray], onsets: int,
           setting: tuple[int, int, float, str, float]) -> list[dict[str, Any]]:  # fmt: skip
    """One row per voice and onset: what the judge heard and its verdict (``setting``: :func:`trial`'s)."""
    rows = []
    for voice, word in words.items():
        for onset_s in [WARM_S + 2.0 + 0.25 * k for k in range(onsets)]:
            heard, sounded = trial(hearing, reply, word, onset_s, *setting)
            verdict = "unheard" if sounded is None and heard.startswith("(") else judge(heard).value
            rows.append({"voice": voice, "onset_s": onset_s - WARM_S, "heard": heard,
                         "verdict": verdict, "echo_ms": sounded})  # fmt: skip
    return rows


def spoken_word(folder: Path, text: str, voices: str) -> dict[str, np.ndarray]:
    """``text`` in each voice, with 0.2 s of silence before it (as ``utterance`` writes it)."""
    if voices == "espeak":
        paths = {v: utterance(folder, text, f"w{len(text)}-{text[:4]}-{v}", **kw) for v, kw in VOICES.items()}
        return {v: soundfile.read(path, dtype="float32")[0] for v, path in paths.items()}
    return {v: piper_speech(text, wpm) for v, wpm in PIPER_RATES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="96:100", help="ONSET_MS:PAUSE_MS pairs, ',' between")
    parser.add_argument(
        "--drift", type=float, default=1e-4, help="echo delay growth (the rig: 1e-4, 0.1 ms a second)"
    )
    parser.add_argument("--words", default="Stop.", help="the words said over the reply, '|' between")
    parser.add_argument("--piper", action="store_true", help="the Piper voice at four rates, not espeak-ng")
    parser.add_argument("--onsets", type=int, default=9, help="onsets per voice, 0.25 s apart from 2.0 s")
    parser.add_argument(
        "--views",
        default="linear",
        help="what the judge hears beside the gated speech, ',' between: linear (the app's), aec3 (before)",
    )
    parser.add_argument(
        "--thresholds", default="0.4", help="the VAD's threshold over the reply, ',' between (0.5: before)"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    asr = Transcriber(AsrOptions(device="cpu", cpu_threads=2), ModelStore(ModelSettings().store_dir))
    hearing = Hearing(asr, lambda _event: None)
    folder = Path(tempfile.mkdtemp(prefix="stop-loop-"))
    reply = soundfile.read(utterance(folder, REPLY, "reply"), dtype="float32")[0]
    reply = np.concatenate([reply, reply])  # the first time through converges the canceller
    said = [w.strip() for w in args.words.split("|") if w.strip()]
    spoken = {w: spoken_word(folder, w, "piper" if args.piper else "espeak") for w in said}
    verdicts = [v.value for v in OverlapVerdict] + ["unheard"]
    results: dict[str, dict[str, list]] = {}
    echo_column = "echo after the word began, median (ms)"
    head = "| onset (ms) | pause after it (ms) | view | threshold | words | " + " | ".join(verdicts)
    print(f"{head} | {echo_column} |")
    print("|---:|---:|---|---:|---|" + "---:|" * (len(verdicts) + 1))
    for setting in args.settings.split(","):
        onset_ms, pause_ms = map(int, setting.split(":"))
        for view in args.views.split(","):
            for threshold in map(float, args.thresholds.split(",")):
                key = f"{setting} {view} {threshold}"
                results[key] = {}
                for text, words in spoken.items():
                    case = (onset_ms, pause_ms, args.drift, view, threshold)
                    rows = judged(hearing, reply, words, args.onsets, case)
                    counts = [sum(r["verdict"] == v for r in rows) for v in verdicts]
                    cells = " | ".join(f"{count}/{len(rows)}" for count in counts)
                    echo_ms = [r["echo_ms"] for r in rows if r["echo_ms"] is not None]
                    echo = f"{np.median(echo_ms):.0f}" if echo_ms else "-"
                    row = f"| {onset_ms} | {pause_ms} | {view} | {threshold} | {text} | {cells} | {echo} |"
                    print(row, flush=True)
                    results[key][text] = rows
    if args.json:
        write_results(args.json, args, results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

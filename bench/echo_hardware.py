"""Echo cancellation on this machine's own speaker and microphone (a laptop, a booth's speakers).

Plays the start-up probe and a spoken reply (espeak-ng) on the speaker, exactly as the app
does, while the microphone records, and runs the capture path's echo cancellation on it
(``assistant.turns.duplex.Duplex``): prints whether the app would be in full duplex here, the
ERLE, the echo's delay and loss, and writes the microphone before and after cancellation to
WAV files to listen to. Keep the room quiet while it runs (about 10 s).

    python -m bench.echo_hardware [--mic DEVICE] [--speaker DEVICE] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.speech import speak, write_wav

REPLY = (
    "The capital of France is Paris. It has been the country's capital for more than a "
    "thousand years, and it is home to the Louvre and the Eiffel Tower."
)


def main(argv: list[str] | None = None) -> int:
    from assistant.config import Settings
    from assistant.events import EchoState, Event
    from assistant.stages.audio import Microphone, Speaker
    from assistant.stages.devices import AudioDeviceError
    from assistant.stages.echo import EchoUnavailable, echo_canceller
    from assistant.turns.duplex import Duplex

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mic", help="input device (name or index; default: the system's)")
    parser.add_argument("--speaker", help="output device (name or index; default: the system's)")
    parser.add_argument("--out", type=Path, help="folder for the WAV files (default: a temporary one)")
    args = parser.parse_args(argv)
    settings = Settings()
    audio = settings.audio
    if args.mic or args.speaker:
        from dataclasses import replace

        audio = replace(
            audio,
            input_device=args.mic or audio.input_device,
            output_device=args.speaker or audio.output_device,
        )
    out = args.out or Path(tempfile.mkdtemp(prefix="echo-hardware-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        canceller, reason = echo_canceller(settings.echo)
        mic, speaker = Microphone(audio), Speaker(audio)
    except (EchoUnavailable, AudioDeviceError) as e:
        print(f"cannot check: {e}", file=sys.stderr)
        return 1
    events: list[Event] = []
    duplex = Duplex(canceller, reason, speaker, mic, probe=True)
    reply = speak(REPLY, out, "reply")
    raw: list[np.ndarray] = []
    cleaned: list[np.ndarray] = []
    try:
        duplex.play_probe()
        time.sleep(1.5)
        duplex.start(events.append)
        speaker.play(1, reply)
        deadline = time.monotonic() + reply.size / 16000 + 1.5
        while time.monotonic() < deadline:
            block = mic.read(0.1)
            if block is None:
                continue
            samples, _t = duplex.clean(*block)
            raw.append(block[0])
            cleaned.append(samples)
        erle, delay = duplex.report()
        stats = duplex.stats()
    finally:
        mic.close()
        speaker.close()
    states = [e for e in events if isinstance(e, EchoState)]
    print(f"speaker: {speaker.name}   microphone: {mic.name}")
    print(states[-1].reason if states else "no echo canceller")
    if stats is not None:
        loss = f"{stats.echo_loss_db:.1f} dB" if stats.echo_loss_db is not None else "-"
        print(
            f"during the reply: ERLE median {erle if erle is None else round(erle, 1)} dB, echo delay "
            f"{delay if delay is None else round(delay)} ms, echo loss (speaker to microphone) {loss}"
        )
    mic_wav = write_wav(out / "microphone.wav", np.concatenate(raw) if raw else np.zeros(0, np.float32))
    clean_wav = write_wav(
        out / "cancelled.wav", np.concatenate(cleaned) if cleaned else np.zeros(0, np.float32)
    )
    print(f"listen: {mic_wav} (what the microphone heard) and {clean_wav} (after cancellation)")
    full = any(s.full_duplex for s in states)
    print(
        "verdict: "
        + (
            "full duplex: barge-in works on these speakers"
            if full
            else "half duplex here: use a headset for barge-in, or see docs/troubleshooting.md"
        )
    )
    return 0 if full else 2


if __name__ == "__main__":
    raise SystemExit(main())

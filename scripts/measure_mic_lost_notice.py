"""Kill the sound server right after ``run --no-tui`` says "listening on"; time the microphone-lost notice.

    PYTHONPATH=$PWD .venv/bin/python scripts/measure_mic_lost_notice.py 4

Uses tests/helpers/sound_server.py's private PulseAudio and app helpers. Prints the seconds from
the kill to the "audio: microphone lost" line for each try (None: not within 15 s).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers.sound_server import App, Pulse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tries", type=int, nargs="?", default=4, help="kills to time (default 4)")
    tries = parser.parse_args().tries
    pulse = Pulse(Path(tempfile.mkdtemp()))
    results: list[float | None] = []
    try:
        for _ in range(tries):
            pulse.start()
            app = App(pulse, Path(tempfile.mkdtemp()), [])
            app.wait_for("listening on", 120)
            kill_ns = pulse.kill()
            try:
                app.wait_for("audio: microphone lost", 15)
                results.append(round((time.monotonic_ns() - kill_ns) / 1e9, 2))
            except AssertionError:
                results.append(None)
            app.proc.kill()
            app.proc.wait()
    finally:
        pulse.stop()
    print("seconds from kill to 'microphone lost':", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

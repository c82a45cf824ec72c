"""Why ASR costs ~0.7 s on 2 CPU cores whatever the question's length, and why we keep it so.

faster-whisper pads every utterance to Whisper's 30 s window, so tiny.en's encoder always
runs on 3000 mel frames. This times the encoder alone on 3000, 1000 and 500 frames, then
transcribes short espeak-ng questions (varied voices) twice: as faster-whisper does, and
with the window cropped to the speech plus ``--margin-s`` (the encoder fed fewer frames),
and counts how often the transcripts differ. Prints tables and writes JSON.

    python -m bench.asr_window --json docs/results/bench-asr-window-cpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from assistant.config import ModelSettings
from bench.corpus import SHORT_QUESTIONS as QUESTIONS
from bench.corpus import VOICES
from bench.speech import speak
from store.bundled import DEFAULT_ASR, ModelStore


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--margin-s", type=float, default=1.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import ctranslate2
    from faster_whisper import WhisperModel

    class CroppedWindow(WhisperModel):
        keep_frames: int | None = None

        def encode(self, features: np.ndarray) -> ctranslate2.StorageView:
            return super().encode(features[..., : self.keep_frames] if self.keep_frames else features)

    path = str(ModelStore(ModelSettings().store_dir).path(DEFAULT_ASR))
    model = CroppedWindow(path, device="cpu", compute_type="int8", cpu_threads=args.threads)
    encoder = {}
    for frames in (3000, 1000, 500):
        sv = ctranslate2.StorageView.from_array(np.zeros((1, 80, frames), np.float32))
        model.model.encode(sv)
        times = []
        for _ in range(5):
            t0 = time.monotonic_ns()
            model.model.encode(sv)
            times.append((time.monotonic_ns() - t0) / 1e6)
        encoder[frames] = float(np.median(times))
    print(f"| encoder frames (10 ms each) | median ms, {args.threads} threads |\n|---:|---:|")
    for frames, ms in encoder.items():
        print(f"| {frames} | {ms:.0f} |")

    def transcribe(audio: np.ndarray, keep: int | None) -> tuple[float, str]:
        model.keep_frames = keep
        t0 = time.monotonic_ns()
        segments, _ = model.transcribe(
            audio, language="en", beam_size=5, condition_on_previous_text=False, without_timestamps=True
        )
        text = "".join(s.text for s in segments).strip()
        return (time.monotonic_ns() - t0) / 1e6, text

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(QUESTIONS):
            voice, wpm = VOICES[i % len(VOICES)]
            audio = speak(text, Path(tmp), f"q{i}", speed_wpm=wpm, voice=voice)
            keep = min(3000, 2 * math.ceil((audio.size / 16000 + args.margin_s) * 50))
            full_ms, full = transcribe(audio, None)
            crop_ms, crop = transcribe(audio, keep)
            rows.append(
                {
                    "asked": text,
                    "voice": voice,
                    "frames": keep,
                    "full": full,
                    "full_ms": full_ms,
                    "cropped": crop,
                    "cropped_ms": crop_ms,
                }
            )
    same = sum(r["full"] == r["cropped"] for r in rows)
    print("\n| question | 30 s window | cropped window |\n|---|---|---|")
    for r in rows:
        print(f"| {r['asked']} | {r['full']} | {r['cropped']} |")
    full_med = np.median([r["full_ms"] for r in rows])
    crop_med = np.median([r["cropped_ms"] for r in rows])
    print(f"\nidentical transcripts {same}/{len(rows)}; ASR median {full_med:.0f} ms -> {crop_med:.0f} ms")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"command": " ".join(sys.argv), "encoder_ms": encoder, "identical": same, "rows": rows},
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

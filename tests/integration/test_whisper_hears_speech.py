"""Whisper tiny.en on real espeak-ng speech, and WAV loading of real sox-made files."""

from __future__ import annotations

import re
import subprocess
import wave

import numpy as np
import pytest

from assistant.stages.asr import AsrModelNotFound, AsrOptions, Transcriber
from assistant.stages.audio_file import AudioFileError, load_wav
from bench.speech import SAMPLE_RATE_HZ, speak
from store.bundled import ModelStore

pytestmark = pytest.mark.slow


def words(text: str) -> str:
    """Lower case, punctuation removed, single spaces."""
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("asr-speech")


@pytest.fixture(scope="module")
def question(speech_dir):
    return speak("What is the capital of France?", speech_dir, name="question")


@pytest.fixture(scope="module")
def transcriber(store: ModelStore) -> Transcriber:
    store.fetch("whisper-tiny.en", progress=lambda _msg: None)
    return Transcriber(AsrOptions(device="cpu"), store)


def test_question_is_transcribed(transcriber, question):
    result = transcriber.transcribe(question)
    assert "capital of france" in words(result.text)
    assert result.text == result.text.strip()
    assert result.audio_ms == pytest.approx(1000 * question.size / SAMPLE_RATE_HZ)
    assert 0 < result.asr_ms < 10_000
    assert result.language == "en"
    assert 0.0 <= result.no_speech_prob < 0.5
    assert transcriber.description == "whisper-tiny.en cpu int8"


def test_warm_up_then_transcribe_again(transcriber, speech_dir):
    assert transcriber.warm_up() > 0
    audio = speak("Turn off the kitchen lights.", speech_dir, name="lights")
    assert "kitchen lights" in words(transcriber.transcribe(audio).text)


def test_too_short_audio_is_empty_without_the_model(transcriber):
    for audio in (np.zeros(0, np.float32), np.full(SAMPLE_RATE_HZ // 20, 0.1, np.float32)):
        result = transcriber.transcribe(audio)
        assert result.text == "" and result.asr_ms == 0.0


def test_missing_store_model_names_the_fix(tmp_path):
    with pytest.raises(AsrModelNotFound, match="assistant models fetch"):
        Transcriber(AsrOptions(), ModelStore(tmp_path))
    with pytest.raises(FileNotFoundError, match="assistant models fetch"):
        Transcriber(AsrOptions(model="no-such-model"), ModelStore(tmp_path))


def sox(args: list[str]) -> None:
    subprocess.run(["sox", *args], check=True)


def test_44k_stereo_wav_becomes_16k_mono_and_still_transcribes(transcriber, speech_dir, question):
    stereo = speech_dir / "stereo44k.wav"
    sox([str(speech_dir / "question.wav"), "-r", "44100", "-c", "2", "-b", "16", str(stereo)])
    audio = load_wav(stereo)
    assert audio.dtype == np.float32 and audio.ndim == 1
    with wave.open(str(stereo)) as w:
        seconds = w.getnframes() / w.getframerate()
    assert audio.size == pytest.approx(seconds * SAMPLE_RATE_HZ, abs=2)
    assert np.abs(audio - question[: audio.size]).max() < 0.05
    assert "capital of france" in words(transcriber.transcribe(audio).text)


@pytest.mark.parametrize("width", [1, 2, 3, 4])
def test_pcm_bit_depths_decode_to_the_same_signal(tmp_path, width):
    tone = 0.5 * np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)
    ints = np.round(tone * (2 ** (8 * width - 1) - 1)).astype("<i4")
    if width == 1:
        raw = (ints + 128).astype(np.uint8).tobytes()
    else:
        raw = b"".join(v.to_bytes(width, "little", signed=True) for v in ints.tolist())
    path = tmp_path / f"tone{width}.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(width)
        w.setframerate(8000)
        w.writeframes(raw)
    audio = load_wav(path)
    assert audio.size == 2 * tone.size  # 1 s at 16 kHz
    # The tone itself at 16 kHz: the resampler interpolates band-limited, not linearly, so it
    # rings for a millisecond where the file starts and stops abruptly mid-wave.
    expected = 0.5 * np.sin(2 * np.pi * 440 * np.arange(audio.size) / 16_000)
    assert np.abs(audio - expected)[16:-16].max() < 0.02


def test_empty_wav_is_an_error(tmp_path):
    path = tmp_path / "empty.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE_HZ)
        w.writeframes(b"")
    with pytest.raises(AudioFileError, match="no audio frames.*sox in.wav -r 16000 -c 1 -b 16"):
        load_wav(path)


def test_random_bytes_and_missing_paths_are_errors(tmp_path):
    junk = tmp_path / "junk.wav"
    junk.write_bytes(np.random.default_rng(0).bytes(4096))
    with pytest.raises(AudioFileError, match="not a readable audio file"):
        load_wav(junk)
    (tmp_path / "zero.wav").write_bytes(b"")
    with pytest.raises(AudioFileError, match="not a readable audio file"):
        load_wav(tmp_path / "zero.wav")
    with pytest.raises(AudioFileError, match="no such audio file"):
        load_wav(tmp_path / "missing.wav")


def test_24_bit_sox_file_reads_as_the_same_speech(tmp_path, speech_dir, question):
    # sox writes a WAVE_FORMAT_EXTENSIBLE header for 24-bit, which the stdlib's wave refused
    # on 3.11 (the app read it with a sox hint); soundfile reads it.
    path = tmp_path / "deep.wav"
    sox([str(speech_dir / "question.wav"), "-b", "24", str(path)])
    audio = load_wav(path)
    assert np.abs(audio - question).max() < 1e-3

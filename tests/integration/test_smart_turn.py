"""Smart Turn v3.2: features equal pipecat's own recipe, the model file is verified, real speech."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import store.bundled as store_mod
from assistant.stages.smart_turn import SAMPLE_RATE_HZ, SmartTurn, TurnModelError, whisper_features
from bench.speech import silence, speak
from store.bundled import BUNDLED, DEFAULT_TURN, FetchError, ModelStore

SPEC = BUNDLED[DEFAULT_TURN]
PKG = "pipecat/audio/turn/smart_turn/"
FETCH = "assistant models fetch smart-turn-v3.2"


@pytest.fixture(scope="session")
def pipecat_wheel(tmp_path_factory) -> Path:
    """The real pipecat-ai wheel the model comes from (never installed); no network is a failure."""
    folder = tmp_path_factory.mktemp("pipecat")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(folder)]
    out = subprocess.run([*cmd, f"{SPEC.package}=={SPEC.version}"], capture_output=True, text=True)
    assert out.returncode == 0, f"pip download failed: {out.stderr}"
    (wheel,) = folder.glob("*.whl")
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == SPEC.wheel_sha256
    return wheel


@pytest.fixture(scope="session")
def pipecat_features(pipecat_wheel, tmp_path_factory):
    """pipecat's own preprocessing: ``truncate_audio_to_last_n_seconds`` then its numpy features."""
    with zipfile.ZipFile(pipecat_wheel) as zf:
        features_src = zf.read(PKG + "_whisper_features.py").decode()
        analyzer_src = zf.read(PKG + "local_smart_turn_v3.py").decode()
    # _whisper_features.py imports only numpy: load it as a standalone module.
    path = tmp_path_factory.mktemp("ref") / "pipecat_whisper_features.py"
    path.write_text(features_src)
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # The analyzer imports pipecat, loguru, soxr: take only its nested truncate/pad function.
    node = next(
        n
        for n in ast.walk(ast.parse(analyzer_src))
        if isinstance(n, ast.FunctionDef) and n.name == "truncate_audio_to_last_n_seconds"
    )
    namespace = {"np": np, "_MODEL_SAMPLE_RATE": SAMPLE_RATE_HZ}
    exec(textwrap.dedent(ast.get_source_segment(analyzer_src, node, padded=True)), namespace)
    truncate = namespace["truncate_audio_to_last_n_seconds"]
    assert "compute_whisper_log_mel_features(audio_array, do_normalize=True)" in analyzer_src

    def reference(audio: np.ndarray) -> np.ndarray:
        return module.compute_whisper_log_mel_features(truncate(audio, n_seconds=8), do_normalize=True)

    return reference


def chirp_and_noise(seconds: float, seed: int) -> np.ndarray:
    t = np.arange(int(seconds * SAMPLE_RATE_HZ)) / SAMPLE_RATE_HZ
    noise = 0.02 * np.random.default_rng(seed).standard_normal(t.size)
    chirp = 0.3 * np.sin(2 * np.pi * (150 + 250 * t) * t) * np.exp(-0.1 * t)
    return (chirp + noise).astype(np.float32)


@pytest.mark.parametrize("seconds", [3.0, 8.0, 10.0])
def test_features_equal_pipecats_recipe(pipecat_features, seconds):
    audio = chirp_and_noise(seconds, seed=int(seconds))
    ours, theirs = whisper_features(audio), pipecat_features(audio)
    assert ours.shape == theirs.shape == (80, 800) and ours.dtype == np.float32
    # faster-whisper computes in float32, pipecat in float64: ~1e-5 apart on a [-1, 1.5] scale.
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=5e-5)


def test_only_the_last_8_seconds_count():
    audio = chirp_and_noise(10.0, seed=1)
    np.testing.assert_array_equal(whisper_features(audio), whisper_features(audio[-8 * SAMPLE_RATE_HZ :]))


@pytest.fixture(scope="module")
def model_file(store) -> Path:
    return store.fetch(DEFAULT_TURN, progress=lambda _msg: None) / "smart-turn-v3.2-cpu.onnx"


def test_the_store_lists_the_model_as_a_turn_model(store, model_file):
    (row,) = [m for m in store.list() if m.name == DEFAULT_TURN]
    assert row.kind == "turn" and row.source == "pipecat-ai==1.14.0"
    assert model_file.stat().st_size == 8_679_182
    assert hashlib.sha256(model_file.read_bytes()).hexdigest() == SPEC.file_sha256


def test_fetch_extracts_one_verified_file(tmp_path, monkeypatch):
    folder = ModelStore(tmp_path / "good").fetch(DEFAULT_TURN, progress=lambda _msg: None)
    assert sorted(p.name for p in folder.iterdir()) == ["assistant-model.json", "smart-turn-v3.2-cpu.onnx"]
    bad = store_mod.BundledModel(**{**SPEC.__dict__, "file_sha256": "0" * 64})
    monkeypatch.setitem(store_mod.BUNDLED, DEFAULT_TURN, bad)
    with pytest.raises(FetchError, match="sha256 mismatch"):
        ModelStore(tmp_path / "bad").fetch(DEFAULT_TURN, progress=lambda _msg: None)
    assert not ModelStore(tmp_path / "bad").is_present(DEFAULT_TURN)


def test_a_damaged_truncated_or_missing_model_is_refused(model_file, tmp_path):
    flipped, truncated = tmp_path / "flipped.onnx", tmp_path / "truncated.onnx"
    data = bytearray(model_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    shutil.copyfile(model_file, truncated)
    with truncated.open("r+b") as f:
        f.truncate(len(data) - 1000)
    for path in (flipped, truncated, tmp_path / "missing.onnx"):
        with pytest.raises(TurnModelError, match=FETCH):
            SmartTurn(path)
    with pytest.raises(TurnModelError, match=FETCH):
        SmartTurn.from_store(ModelStore(tmp_path / "empty-store"))


@pytest.fixture(scope="module")
def smart_turn(model_file) -> SmartTurn:
    model = SmartTurn(model_file)
    assert model.warm_up() > 0
    return model


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("turn-speech")


# 0.2 s of silence after the words: when pipecat's VAD stops and asks the model.
# Seen on espeak-ng speech: 0.95, 0.98, 0.93 complete; 0.009, 0.11 unfinished. The model is fooled
# by a falling espeak intonation on some unfinished ones ("I want to go to the": 0.97).
@pytest.mark.parametrize(
    ("text", "complete"),
    [
        ("What is the capital of France?", True),
        ("Can you tell me the weather for tomorrow?", True),
        ("What time is it?", True),
        ("I would like to know", False),
        ("The capital of France is", False),
    ],
)
def test_finished_and_unfinished_sentences(smart_turn, speech_dir, text, complete):
    audio = np.concatenate([speak(text, speech_dir, text[:12].replace(" ", "_")), silence(0.2)])
    score = smart_turn.score(audio)
    assert (score.probability >= 0.5) == complete, score
    assert 0 < score.inference_ms < 2000

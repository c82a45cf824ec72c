"""The PyTorch Whisper backend: converted bundled weights, its decode loop, and its selection."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

import assistant.stages.asr_torch as asr_torch
import assistant.stages.whisper_search as whisper_search
from assistant.config import ConfigError, load_settings
from assistant.stages.asr import AsrOptions, Transcriber
from assistant.stages.asr_torch import TorchTranscriber, choose_backend, open_transcriber
from bench.speech import speak
from store.bundled import ModelStore
from store.whisper_weights import converted_folder

pytestmark = pytest.mark.slow
TINY = "whisper-tiny.en"


def words(text: str) -> str:
    """Lower case, punctuation removed, single spaces."""
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


@pytest.fixture(scope="module")
def tmp_store(store: ModelStore, tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    """A store whose tiny.en links to the real one's files: the conversion writes here."""
    real = store.fetch(TINY, progress=lambda _msg: None)
    root = tmp_path_factory.mktemp("asr-torch-store")
    folder = root / "models" / TINY
    folder.mkdir(parents=True)
    for f in real.iterdir():
        if f.is_file():
            os.symlink(f, folder / f.name)
    return ModelStore(root)


@pytest.fixture(scope="module")
def torch_asr(tmp_store: ModelStore) -> TorchTranscriber:
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))
    return TorchTranscriber(AsrOptions(device="cpu", backend="torch"), tmp_store)


def test_converted_encoder_equals_ctranslate2(tmp_store: ModelStore, torch_asr: TorchTranscriber) -> None:
    """The converted weights compute what CTranslate2 computes from model.bin (float32 both)."""
    import ctranslate2
    import torch

    features = np.random.default_rng(1).standard_normal((1, 80, 3000)).astype(np.float32)
    ct2 = ctranslate2.models.Whisper(str(tmp_store.path(TINY)), device="cpu", compute_type="float32")
    expected = np.array(ct2.encode(ctranslate2.StorageView.from_array(features)))
    with torch.inference_mode():
        got = torch_asr.model.model.encoder(torch.from_numpy(features)).last_hidden_state.numpy()
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 1e-4
    assert (tmp_store.path(TINY) / "torch" / "model.safetensors").is_file()
    assert converted_folder(tmp_store.path(TINY)) == tmp_store.path(TINY) / "torch"  # once: reused


@pytest.mark.parametrize(
    "text", ["What is the capital of France?", "Turn off the kitchen lights and set a timer for ten minutes."]
)
def test_same_words_as_faster_whisper(
    tmp_store: ModelStore, torch_asr: TorchTranscriber, tmp_path: Path, text: str
) -> None:
    """Real espeak-ng speech: the torch backend hears what faster-whisper hears, greedy and beam."""
    audio = speak(text, tmp_path)
    reference = Transcriber(AsrOptions(device="cpu", compute_type="float32"), tmp_store)
    for quick in (True, False):  # greedy, then the beam of 5
        expected = reference.transcribe(audio, quick=quick)
        assert words(torch_asr.transcribe(audio, quick=quick).text) == words(expected.text), quick
    result = torch_asr.transcribe(audio)
    assert words(result.text).startswith(words(text).split()[0])  # and it is speech, not nothing
    assert result.clips == 1 and result.language == "en" and result.no_speech_prob < 0.5
    assert torch_asr.description == f"{TINY} torch cpu float32"


def test_silence_and_short_audio(torch_asr: TorchTranscriber) -> None:
    assert torch_asr.transcribe(np.zeros(800, np.float32)).text == ""  # under 0.1 s: model not run
    assert torch_asr.warm_up() > 0


def test_decode_loop_equals_transformers_full_forward(tmp_path: Path, store: ModelStore, monkeypatch) -> None:
    """A small random Whisper: our cached greedy loop picks the tokens transformers' uncached
    forward picks at every step (same suppression), so the cache and positions are right."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    config = WhisperConfig(
        vocab_size=51864, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_source_positions=1500, max_target_positions=448, decoder_start_token_id=50257,
        eos_token_id=50256, pad_token_id=50256, bos_token_id=50256, suppress_tokens=[1, 2, 7],
        begin_suppress_tokens=[220, 50256], init_std=0.2,
    )  # fmt: skip
    WhisperForConditionalGeneration(config).save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").symlink_to(store.path(TINY) / "tokenizer.json")
    monkeypatch.setattr(whisper_search, "MAX_TOKENS", 26)
    asr = TorchTranscriber(
        AsrOptions(model=str(tmp_path), device="cpu", backend="torch"), ModelStore(tmp_path)
    )
    features = asr.log_mel(np.random.default_rng(2).standard_normal(16000).astype(np.float32) * 0.1)
    with torch.inference_mode():
        tokens, _ = asr.search.decode(features)
        encoded = asr.model.model.encoder(features)
        ids = list(asr.search.prompt)
        for step in range(len(tokens)):
            logits = asr.model(encoder_outputs=encoded, decoder_input_ids=torch.tensor([ids])).logits[0, -1]
            logits = logits.masked_fill(asr.search.suppress, -torch.inf)
            if step == 0:
                logits[asr.search.suppress_begin] = -torch.inf
            ids.append(int(logits.argmax()))
    assert len(tokens) == 26 - len(asr.search.prompt)  # a random model rarely ends: the cap stops it
    assert len(set(tokens)) > 5  # varied tokens, so a broken cache would show
    assert tokens == ids[len(asr.search.prompt) :]


def test_choice_of_backend(monkeypatch) -> None:
    monkeypatch.setattr(asr_torch, "ctranslate2_cuda_devices", lambda: 0)
    assert choose_backend(AsrOptions(device="cuda")) == "torch"  # CTranslate2 without CUDA
    assert choose_backend(AsrOptions(device="cpu")) == "ctranslate2"
    assert choose_backend(AsrOptions(device="cuda", backend="ctranslate2")) == "ctranslate2"
    assert choose_backend(AsrOptions(device="cpu", backend="torch")) == "torch"
    monkeypatch.setattr(asr_torch, "ctranslate2_cuda_devices", lambda: 1)
    assert choose_backend(AsrOptions(device="cuda")) == "ctranslate2"
    assert choose_backend(AsrOptions(device="auto")) == "ctranslate2"


def test_backend_setting(tmp_path: Path, tmp_store: ModelStore) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[asr]\nbackend = "torch"\ndevice = "cpu"\n')
    settings = load_settings(config, env={})
    assert settings.asr.backend == "torch"
    assert isinstance(open_transcriber(settings.asr, tmp_store), TorchTranscriber)
    assert load_settings(None, env={"ASSISTANT_ASR_BACKEND": "ctranslate2"}).asr.backend == "ctranslate2"
    with pytest.raises(ConfigError, match="backend"):
        load_settings(None, env={"ASSISTANT_ASR_BACKEND": "tensorrt"})


def test_phrase_scores_rank_as_faster_whisper_ranks_them(
    tmp_store: ModelStore, torch_asr: TorchTranscriber, tmp_path: Path
) -> None:
    """Forced decoding on the torch backend: the phrase said first, as CTranslate2 scores it (float32)."""
    audio = speak("Please stop.", tmp_path)
    phrases = ["Please stop.", "Please come.", "Stop.", "What is the capital of Germany?"]
    reference = Transcriber(AsrOptions(device="cpu", compute_type="float32"), tmp_store)
    expected = reference.phrase_logprobs(audio, phrases)
    got = torch_asr.phrase_logprobs(audio, phrases)
    assert np.argsort(got).tolist() == np.argsort(expected).tolist(), (got, expected)
    assert abs(got[0] - expected[0]) < 0.3, (got, expected)  # 30 s window against the fitted one
    assert torch_asr.phrase_logprobs(np.zeros(800, np.float32), ["Stop."]) == [-np.inf]

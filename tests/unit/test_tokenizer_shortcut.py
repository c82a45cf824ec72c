"""The tokenizer shortcut loads what AutoTokenizer would, and only where it would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from transformers.models.auto.tokenization_auto import MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS

from assistant.stages.tokenizer import TOKENIZERS_BACKEND_TYPES, tokenizer_class
from models.config import SUPPORTED_MODEL_TYPES


def test_the_shortcut_types_are_supported_and_never_overridden_by_auto_tokenizer():
    assert TOKENIZERS_BACKEND_TYPES <= set(SUPPORTED_MODEL_TYPES)
    assert not TOKENIZERS_BACKEND_TYPES & MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS


def folder(tmp_path: Path, model_type: str, **tokenizer_config: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return tmp_path


@pytest.mark.parametrize(
    ("model_type", "config", "shortcut"),
    [
        ("llama", {"tokenizer_class": "TokenizersBackend"}, True),
        ("qwen2", {"tokenizer_class": "TokenizersBackend"}, False),  # AutoTokenizer picks Qwen2Tokenizer
        ("phi3", {"tokenizer_class": "TokenizersBackend"}, False),
        ("llama", {"tokenizer_class": "LlamaTokenizer"}, False),
        ("llama", {"tokenizer_class": "TokenizersBackend", "auto_map": {"AutoTokenizer": "x.Y"}}, False),
    ],
)
def test_only_a_plain_tokenizers_backend_of_a_known_type_skips_auto_tokenizer(
    tmp_path, model_type, config, shortcut
):
    chosen = tokenizer_class(folder(tmp_path, model_type, **config))
    assert (chosen.__name__ == "TokenizersBackend") is shortcut


def test_a_folder_without_its_json_goes_through_auto_tokenizer(tmp_path):
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    assert tokenizer_class(tmp_path).__name__ == "AutoTokenizer"

"""The LLM's tokenizer with its chat template: loaded once, without torch where transformers allows."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from assistant.stages.plain_tokenizer import load_plain
from models.files import FETCH_HINT, CorruptModel, ModelNotFound
from store.records import repair_hint


def load_tokenizer(model_dir: Path) -> Any:
    """The fast tokenizer (with chat template) saved in ``model_dir``; its files parsed once.

    A file that does not load is then checked for its shape, so the error names it.

    Raises:
        ModelNotFound: No tokenizer files.
        CorruptModel: A tokenizer file is not JSON of the expected shape (names the file).
        ChatTemplateError: The chat template raises on a plain conversation (names its file).
    """
    try:
        # Without importing transformers where it would load the folder as saved: 0.8 s.
        tokenizer = load_plain(model_dir) if plain_backend(model_dir) else None
        if tokenizer is None:
            tokenizer = tokenizer_class(model_dir).from_pretrained(model_dir)
    except OSError as e:
        _check_tokenizer_files(model_dir)  # parsed again only to name the damaged file
        raise ModelNotFound(f"no usable tokenizer in {model_dir}: {e}; {FETCH_HINT}") from e
    except Exception as e:  # tokenizers and transformers raise bare KeyError, TypeError, Exception...
        _check_tokenizer_files(model_dir)
        raise CorruptModel(
            f"the tokenizer files in {model_dir} (tokenizer.json, tokenizer_config.json) cannot be "
            f"loaded ({type(e).__name__}: {e}); {repair_hint(model_dir)}"
        ) from e
    if not tokenizer.chat_template:
        raise ModelNotFound(f"{model_dir} has no chat template; use an instruct/chat model")
    render_chat(tokenizer, TRIAL_CONVERSATION)  # a template that raises is named at start, not mid-turn
    return tokenizer


class ChatTemplateError(CorruptModel):
    """The model's chat template raised while rendering a conversation (names the file)."""


# A conversation every chat template renders: system prompt, an exchange and the next question.
TRIAL_CONVERSATION = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello."},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "What is the capital of France?"},
)


def template_file(model_dir: Path) -> Path:
    """The file a folder's chat template comes from, as transformers reads it.

    ``chat_template.jinja`` when present, else ``chat_template.json``, else
    ``tokenizer_config.json`` (its ``chat_template`` key).
    """
    for name in ("chat_template.jinja", "chat_template.json"):
        if (model_dir / name).is_file():
            return model_dir / name
    return model_dir / "tokenizer_config.json"


def render_chat(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    """``messages`` through the tokenizer's chat template, with the generation prompt.

    Raises:
        ChatTemplateError: The template raised (its ``raise_exception``, a Jinja error, a
            Python error inside it): one line naming the template's file and the fix.
    """
    try:
        return str(tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True))
    except Exception as e:  # a template may raise anything: TemplateError, TypeError, KeyError...
        folder = Path(getattr(tokenizer, "name_or_path", "") or ".")
        raise ChatTemplateError(
            f"the chat template in {template_file(folder)} fails ({type(e).__name__}: {e}); "
            f"fix the template or {repair_hint(folder)}"
        ) from e


# Model types for which AutoTokenizer loads the ``TokenizersBackend`` a tokenizer_config.json names
# (transformers 5 overrides that name for the types in its MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS,
# qwen2 and phi3 among them; tests/unit/test_tokenizer_shortcut.py keeps this list outside that set).
TOKENIZERS_BACKEND_TYPES = frozenset(
    {"llama", "qwen3", "mistral", "ministral", "gemma2", "gemma3_text", "gemma3"}
)


def tokenizer_class(model_dir: Path) -> Any:
    """The class ``AutoTokenizer`` would load, imported without transformers' auto machinery.

    When ``tokenizer_config.json`` names ``TokenizersBackend`` (what transformers 5 saves for
    most chat models, and the store's GGUF import writes), has no custom code (``auto_map``) and
    the model's type is one AutoTokenizer does not override (:data:`TOKENIZERS_BACKEND_TYPES`),
    AutoTokenizer loads exactly that class, but first imports its model registry and with it
    torch: 3.3 s against 0.8 s on this 2-core CPU (docs/benchmarks.md, "Start-up"), for the
    ONNX Runtime path that never needs torch. Anything else goes through ``AutoTokenizer``.
    """
    if plain_backend(model_dir):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend
    from transformers import AutoTokenizer

    return AutoTokenizer


def plain_backend(model_dir: Path) -> bool:
    """Whether AutoTokenizer would load the ``TokenizersBackend`` the folder names.

    ``tokenizer_config.json`` names it, without custom code (``auto_map``), for a model type
    AutoTokenizer does not override (:data:`TOKENIZERS_BACKEND_TYPES`).
    """
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        model_type = json.loads((model_dir / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return False
    return (
        isinstance(config, dict)
        and config.get("tokenizer_class") == "TokenizersBackend"
        and "auto_map" not in config
        and model_type in TOKENIZERS_BACKEND_TYPES
    )


# Top-level keys a tokenizers-library tokenizer.json must have, and their JSON types.
TOKENIZER_SHAPE: dict[str, type] = {"model": dict, "added_tokens": list}


def _check_tokenizer_files(model_dir: Path) -> None:
    """Name the file when tokenizer.json / tokenizer_config.json is not JSON of the right shape."""
    for name, shape in (("tokenizer.json", TOKENIZER_SHAPE), ("tokenizer_config.json", {})):
        path = model_dir / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise CorruptModel(f"{path} is not readable JSON ({e}); {repair_hint(model_dir)}") from e
        problem = None if isinstance(data, dict) else f"{type(data).__name__} where a JSON object belongs"
        for key, kind in shape.items():
            if problem is None and not isinstance(data.get(key), kind):
                problem = f"{key!r} is missing or not a JSON {'object' if kind is dict else 'array'}"
        if problem:
            raise CorruptModel(f"{path} is not a tokenizer file: {problem}; {repair_hint(model_dir)}")

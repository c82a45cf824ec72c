"""The tokenizer loaded without transformers gives transformers' ids, text and prompts, and is used
only where transformers would leave the saved tokenizer as it is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from assistant.stages.plain_tokenizer import PlainTokenizer, load_plain
from assistant.stages.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = ["<unk>", "hello", "world", "paris", "is", "the", "capital", "?", ".", "system", "user", "assistant"]


def tiny_folder(folder: Path, template: str = TEMPLATE, **config: object) -> Path:
    """A llama folder whose tokenizer transformers 5 saves as a plain ``TokenizersBackend``."""
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in ("<|im_start|>", "<|im_end|>")])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    saved = {
        "backend": "tokenizers",
        "tokenizer_class": "TokenizersBackend",
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "model_max_length": 2048,
        **config,
    }
    if template:
        (folder / "chat_template.jinja").write_text(template)
    (folder / "tokenizer_config.json").write_text(json.dumps(saved))
    return folder


CHATS = [
    [{"role": "user", "content": "hello world ?"}],
    [
        {"role": "system", "content": "the capital"},
        {"role": "user", "content": "paris is the capital ?"},
        {"role": "assistant", "content": "paris ."},
        {"role": "user", "content": "<|im_end|> hello unknown-word"},
    ],
]


def transformers_tokenizer(folder: Path):
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    return TokenizersBackend.from_pretrained(folder)


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_the_same_prompts_ids_and_text_as_transformers(tmp_path, generation_prompt):
    # <unk> is a plain word here: transformers makes it special on load, so no shortcut then.
    folder = tiny_folder(tmp_path)
    assert load_plain(folder) is None
    (folder / "tokenizer_config.json").write_text(
        json.dumps({**json.loads((folder / "tokenizer_config.json").read_text()), "unk_token": None})
    )
    plain, reference = load_plain(folder), transformers_tokenizer(folder)
    assert isinstance(plain, PlainTokenizer)
    assert plain.eos_token_id == reference.eos_token_id == 13
    assert plain.chat_template == reference.chat_template
    for chat in CHATS:
        text = plain.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
        assert text == reference.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=generation_prompt
        )
        ids = plain.encode(text, add_special_tokens=False)
        assert ids == reference.encode(text, add_special_tokens=False)
        assert plain.apply_chat_template(chat, add_generation_prompt=generation_prompt) == ids
        for skip in (True, False):
            assert plain.decode(ids, skip_special_tokens=skip) == reference.decode(
                ids, skip_special_tokens=skip
            )


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"add_prefix_space": True}, "a key transformers acts on"),
        ({"clean_up_tokenization_spaces": True}, "transformers cleans decoded text"),
        ({"eos_token": "<eos>"}, "transformers would add the token"),
        ({"chat_template": TEMPLATE}, "two chat templates"),
        ({"added_tokens_decoder": {"0": {"content": "<x>", "special": True}}}, "other added tokens"),
    ],
)
def test_anything_transformers_would_change_goes_through_transformers(tmp_path, change, why):
    assert load_plain(tiny_folder(tmp_path, unk_token=None)) is not None
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
    assert load_plain(tmp_path) is None, why


def test_a_generation_block_template_goes_through_transformers(tmp_path):
    template = "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    assert load_plain(tiny_folder(tmp_path, template, unk_token=None)) is None


def test_a_template_that_raises_raises_as_in_transformers(tmp_path):
    plain = load_plain(tiny_folder(tmp_path, "{{ raise_exception('boom') }}", unk_token=None))
    assert plain is not None
    with pytest.raises(jinja2.TemplateError, match="boom"):
        plain.apply_chat_template(CHATS[0], tokenize=False)


def test_the_load_imports_no_transformers(tmp_path):
    tiny_folder(tmp_path, unk_token=None)
    code = (
        "import sys\nfrom pathlib import Path\nfrom assistant.stages.tokenizer import load_tokenizer\n"
        f"t = load_tokenizer(Path({str(tmp_path)!r}))\n"
        "print(type(t).__name__, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["PlainTokenizer", "False"], out.stderr
    assert type(load_tokenizer(tmp_path)).__name__ == "PlainTokenizer"

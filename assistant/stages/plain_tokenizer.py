"""A plain ``TokenizersBackend`` loaded without importing transformers (0.8 s of start-up).

transformers 5 saves most chat models' tokenizers as ``TokenizersBackend``: the tokenizers
library's ``tokenizer.json`` plus a chat template and named special tokens. When the folder
holds nothing that transformers would change on load (the keys of ``tokenizer_config.json``
are all in :data:`PLAIN_KEYS`, every named special token is a special added token of
``tokenizer.json``, one chat template), :class:`PlainTokenizer` gives the same ids, text and
prompts as transformers with the tokenizers library and jinja2 directly, rendering the chat
template in the sandboxed environment transformers uses (``transformers.utils.
chat_template_utils``). ``tests/unit/test_plain_tokenizer.py`` compares the two.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

# Named special tokens, as transformers' SPECIAL_TOKENS_ATTRIBUTES.
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# tokenizer_config.json keys that change nothing the app uses when transformers loads the folder.
PLAIN_KEYS = frozenset(
    {
        *SPECIAL_NAMES,
        "tokenizer_class",
        "backend",
        "chat_template",
        "model_max_length",
        "is_local",
        "local_files_only",
        "model_input_names",
        "padding_side",
        "truncation_side",
        "clean_up_tokenization_spaces",  # only when false (checked)
        "added_tokens_decoder",  # only when it repeats tokenizer.json's added tokens (checked)
    }
)


class PlainTokenizer:
    """What the app calls on a ``TokenizersBackend`` (encode, decode, chat template), without transformers.

    Args:
        tokenizer: ``tokenizer.json`` loaded by the tokenizers library.
        config: The folder's ``tokenizer_config.json``.
        chat_template: Its chat template.
        name_or_path: The model folder (``render_chat`` names the template's file in it).
    """

    def __init__(
        self, tokenizer: Any, config: dict[str, Any], chat_template: str, name_or_path: str = ""
    ) -> None:
        self._tokenizer = tokenizer
        self.name_or_path = name_or_path  # the model folder, as transformers names it (error messages)
        self.chat_template = chat_template
        self.special_tokens_map = {n: _content(config[n]) for n in SPECIAL_NAMES if config.get(n) is not None}
        eos = self.special_tokens_map.get("eos_token")
        self.eos_token_id = self._tokenizer.token_to_id(eos) if eos is not None else None

    def __len__(self) -> int:
        """The vocabulary with the added tokens, as ``len()`` of a transformers tokenizer."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens``: the tokenizer's post-processor too)."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        """The id of one token, or None."""
        found = self._tokenizer.token_to_id(token)
        return None if found is None else int(found)

    def apply_chat_template(
        self,
        conversation: list[dict[str, Any]],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        return_dict: bool = False,
    ) -> str | list[int]:
        """The prompt of ``conversation`` (a list of ``{"role", "content"}`` dicts), or its ids.

        Raises:
            ValueError: An empty conversation (as transformers).
            TypeError: ``return_dict`` with ``tokenize`` (not supported here).
            jinja2.TemplateError: The template raised (``raise_exception``) or does not parse.
        """
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        if tokenize and return_dict:
            raise TypeError("PlainTokenizer.apply_chat_template returns ids, not a dict")
        # As transformers: keys whose value is None are dropped, reasoning gets its aliases,
        # and the named special tokens are variables.
        messages = [_aliased({k: v for k, v in dict(m).items() if v is not None}) for m in conversation]
        text = str(
            _compiled(self.chat_template).render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens_map,
            )
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text


def load_plain(model_dir: Path) -> PlainTokenizer | None:
    """``model_dir``'s tokenizer, or ``None`` where transformers would change it on load.

    Not ``None`` when transformers would load a ``TokenizersBackend`` it leaves as saved.

    ``tokenizer.json`` is parsed once, by the tokenizers library (its errors propagate).
    """
    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or set(config) - PLAIN_KEYS:
        return None
    if config.get("clean_up_tokenization_spaces", False) is not False:
        return None
    template = _one_chat_template(model_dir, config.get("chat_template"))
    if template is None:
        return None
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    added = {i: (t.content, t.special) for i, t in tokenizer.get_added_tokens_decoder().items()}
    special = {text for text, is_special in added.values() if is_special}
    if not all(_content(config[n]) in special for n in SPECIAL_NAMES if config.get(n) is not None):
        return None  # transformers would add it as a special token
    declared = config.get("added_tokens_decoder")
    if declared is not None and not _same_added_tokens(declared, added):
        return None
    return PlainTokenizer(tokenizer, config, template, str(model_dir))


def _one_chat_template(model_dir: Path, in_config: Any) -> str | None:
    """The chat template (``chat_template.jinja`` or the config's), if exactly one plain one."""
    template_file = model_dir / "chat_template.jinja"
    if template_file.is_file() == (in_config is not None):  # none, or two that could differ
        return None
    try:
        template = template_file.read_text(encoding="utf-8") if in_config is None else in_config
    except (OSError, ValueError):
        return None
    if not isinstance(template, str) or not template or GENERATION_TAG.search(template):
        return None  # {% generation %} needs transformers' AssistantTracker extension
    return template


def _aliased(message: dict[str, Any]) -> dict[str, Any]:
    """Transformers' ``_alias_reasoning_fields`` for one message."""
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    return (
        message if reasoning is None else {"thinking": reasoning, **message, "reasoning_content": reasoning}
    )


def _content(token: str | dict[str, Any]) -> str:
    """A special token's text (tokenizer_config.json writes it as a string or an AddedToken dict)."""
    return str(token["content"]) if isinstance(token, dict) else str(token)


def _same_added_tokens(declared: Any, added: dict[int, tuple[str, bool]]) -> bool:
    """``added_tokens_decoder`` lists exactly tokenizer.json's added tokens (id, text, special)."""
    if not isinstance(declared, dict) or not all(isinstance(v, dict) for v in declared.values()):
        return False
    theirs = {str(k): (v.get("content"), v.get("special")) for k, v in declared.items()}
    return theirs == {str(i): token for i, token in added.items()}


@lru_cache(maxsize=8)
def _compiled(template: str) -> Any:
    """``template`` compiled in the sandbox transformers renders chat templates in."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 (Jinja's signature trick)
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    "Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}."
                )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env.from_string(template)

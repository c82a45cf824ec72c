"""The bundled SmolLM2 tokenizer, loaded without transformers, equals transformers' on real text."""

from __future__ import annotations

import numpy as np

from assistant.stages.plain_tokenizer import PlainTokenizer
from assistant.stages.tokenizer import load_tokenizer

TEXTS = [
    "What is the capital of France?",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\n\n\nand   runs of spaces",
    "Ünïcödé, emoji 🙂👍🏽, CJK 東京, Arabic مرحبا, math ∑x²",
    "code: def f(x):\n    return x ** 2  # comment",
    "<|im_start|>user\nliteral special tokens<|im_end|> in text <|endoftext|>",
    "numbers 1234567890 3.14159 -42 1e-9",
    "",
]


def test_the_bundled_tokenizer_matches_transformers(model_dir):
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    plain, reference = load_tokenizer(model_dir), TokenizersBackend.from_pretrained(model_dir)
    assert isinstance(plain, PlainTokenizer)
    assert plain.eos_token_id == reference.eos_token_id and plain.chat_template == reference.chat_template
    for text in TEXTS:
        for special in (True, False):
            assert plain.encode(text, add_special_tokens=special) == reference.encode(
                text, add_special_tokens=special
            ), text
    chats = [[{"role": "user", "content": t}] for t in TEXTS] + [
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": TEXTS[0]},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": TEXTS[3]},
        ]
    ]
    for chat in chats:
        for generation_prompt in (True, False):
            text = plain.apply_chat_template(chat, tokenize=False, add_generation_prompt=generation_prompt)
            assert text == reference.apply_chat_template(
                chat, tokenize=False, add_generation_prompt=generation_prompt
            )
    rng = np.random.default_rng(0)
    vocab = reference.backend_tokenizer.get_vocab_size()
    runs = [rng.integers(0, vocab, n).tolist() for n in (1, 2, 3, 7, 40)] + [[0, 1, 2, 17, 2, 100, 5]]
    runs += [plain.encode(t, add_special_tokens=False)[:k] for t in TEXTS for k in (1, 2, 5)]
    for ids in runs:  # single ids and cuts mid-character, as the streaming detokenizer decodes
        for skip in (True, False):
            assert plain.decode(ids, skip_special_tokens=skip) == reference.decode(
                ids, skip_special_tokens=skip
            ), ids

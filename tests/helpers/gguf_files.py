"""Tiny random GGUF files written with the ``gguf`` package, as llama.cpp lays them out.

No real GGUF but the bundled SmolLM2 exists on this machine, and that one takes 15-30 s to
convert; these have the real layout (metadata keys, tensor names, a byte-level BPE tokenizer
with a ChatML template, Q8_0 blocks) at a size that converts in about a second.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quantize
from transformers.convert_slow_tokenizer import bytes_to_unicode

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "a n", "e r", "o n", "Ġ a"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HIDDEN, HEADS, KV_HEADS, LAYERS, FFN = 64, 4, 2, 2, 128


def _vocab() -> tuple[list[str], list[int]]:
    tokens = list(bytes_to_unicode().values())
    tokens += ["".join(m.split(" ")) for m in MERGES]
    types = [TokenType.NORMAL] * len(tokens) + [TokenType.CONTROL] * len(SPECIALS)
    return tokens + SPECIALS, [int(t) for t in types]


def write_tiny_gguf(
    path: Path, arch: str = "llama", *, seed: int = 0, quant: str = "Q8_0", split_count: int = 0
) -> Path:
    """A random ``arch`` (``llama`` or ``qwen2``) decoder with its tokenizer, written to ``path``.

    The 2-D weights are stored as ``quant`` (a ggml type name: ``Q8_0``, ``F16``...; one the
    ``gguf`` package cannot quantize to is written as blocks of zeros), the norms as F32, as
    llama.cpp's quantizer leaves them. Another ``arch`` name writes the same tensors under it;
    ``split_count`` marks the file as the first of that many parts (llama-gguf-split's keys).
    """
    rng = np.random.default_rng(seed)
    tokens, types = _vocab()
    vocab = len(tokens)
    head_dim = HIDDEN // HEADS
    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(CHAT_TEMPLATE)
    if split_count:  # as llama-gguf-split marks each part (this one holds all tensors anyway)
        writer.add_uint16("split.no", 0)
        writer.add_uint16("split.count", split_count)
    qtype = GGMLQuantizationType[quant]

    def matrix(name: str, rows: int, cols: int) -> None:
        data = (rng.standard_normal((rows, cols)) * 0.5).astype(np.float32)
        try:
            packed = quantize(data, qtype)
        except NotImplementedError:  # a type gguf cannot write either: blocks of zeros
            block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
            packed = np.zeros((rows, cols // block_elems * block_bytes), dtype=np.uint8)
        writer.add_tensor(name, packed, raw_dtype=qtype)

    def vector(name: str, size: int, scale: float = 0.1, base: float = 1.0) -> None:
        writer.add_tensor(name, (base + scale * rng.standard_normal(size)).astype(np.float32))

    matrix("token_embd.weight", vocab, HIDDEN)
    vector("output_norm.weight", HIDDEN)
    matrix("output.weight", vocab, HIDDEN)
    for i in range(LAYERS):
        block = f"blk.{i}"
        vector(f"{block}.attn_norm.weight", HIDDEN)
        matrix(f"{block}.attn_q.weight", HEADS * head_dim, HIDDEN)
        matrix(f"{block}.attn_k.weight", KV_HEADS * head_dim, HIDDEN)
        matrix(f"{block}.attn_v.weight", KV_HEADS * head_dim, HIDDEN)
        if arch == "qwen2":
            vector(f"{block}.attn_q.bias", HEADS * head_dim, 0.5, 0.0)
            vector(f"{block}.attn_k.bias", KV_HEADS * head_dim, 0.5, 0.0)
            vector(f"{block}.attn_v.bias", KV_HEADS * head_dim, 0.5, 0.0)
        matrix(f"{block}.attn_output.weight", HIDDEN, HEADS * head_dim)
        vector(f"{block}.ffn_norm.weight", HIDDEN)
        matrix(f"{block}.ffn_gate.weight", FFN, HIDDEN)
        matrix(f"{block}.ffn_up.weight", FFN, HIDDEN)
        matrix(f"{block}.ffn_down.weight", HIDDEN, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

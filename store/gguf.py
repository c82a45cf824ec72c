"""GGUF files (llama.cpp, Ollama): checked, then de-quantized once into a safetensors folder.

:func:`convert_gguf` is the one conversion, used for the bundled SmolLM2 (``store.bundled``)
and for any GGUF a user names (``store.gguf_import``). It reads the file with the ``gguf``
package first, so a file that is no GGUF, is cut short, holds an architecture the decoder
does not implement or a quantisation that cannot be de-quantized is refused before
transformers spends most of the time on it (the header read takes 5 s of SmolLM2's 35 s
conversion: the reader parses its 49,152 tokens and merges one by one). The weights are
written in fp32: exactly the values transformers' own GGUF load gives, whatever the
quantisation.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from models import config as model_config
from models.config import DecoderConfig, InvalidConfig, UnsupportedModel
from models.files import CorruptModel
from store.gguf_header import HeaderDamaged, check_header

logger = logging.getLogger(__name__)

Step = Callable[[str, float], None]
"""``step(what, fraction_done)``: the conversion's progress, 0 to 1."""

MAGIC = b"GGUF"
GGUF_HINT = "re-download it, or export it again with llama.cpp (convert_hf_to_gguf.py)"

# llama.cpp's general.architecture -> the transformers model_type the conversion writes.
# (A llama file whose general.name says Mistral becomes "mistral", as transformers does.)
ARCH_MODEL_TYPES = {"gemma3": "gemma3_text", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}


class UnsupportedQuantization(UnsupportedModel):
    """The GGUF holds tensors in a type that cannot be de-quantized here."""


@dataclass(frozen=True)
class GgufInfo:
    """What :func:`inspect_gguf` read from a file's header."""

    path: Path
    architecture: str  # general.architecture, as llama.cpp writes it
    model_type: str  # the transformers model_type it converts to
    name: str
    tensor_types: dict[str, int]  # ggml type name -> how many tensors have it
    parameters: int  # elements of all tensors

    @property
    def fp32_bytes(self) -> int:
        """Size of the converted weights (fp32), the store space a conversion needs."""
        return 4 * self.parameters


class _Truncated(Exception):
    def __init__(self, end: int) -> None:
        self.end = end


def _reader(path: Path) -> Any:
    """A ``gguf.GGUFReader`` of ``path`` that raises :class:`_Truncated` when tensor data is cut off.

    The reader itself fails there with numpy's "cannot reshape array ..."; the end of the
    tensor data is checked first, in the hook where the reader has just read the tensor table.
    """
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

    class Reader(GGUFReader):  # type: ignore[misc]
        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            end = 0
            for field in fields:
                dims, raw_type, offset = field.parts[3], field.parts[4], field.parts[5]
                block_elems, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_type[0]))]
                n_bytes = int(np.prod(dims)) * block_bytes // block_elems
                end = max(end, int(start_offs) + int(offset[0]) + n_bytes)
            if end > len(self.data):
                raise _Truncated(end)
            super()._build_tensors(start_offs, fields)

    return Reader(path)


def _truncated(path: Path, end: int, size: int) -> str:
    return f"{path} is truncated: its tensors need {end:,} bytes, it has {size:,}; {GGUF_HINT}"


def _string_field(reader: Any, key: str) -> str:
    """A string value of the header, ``""`` when absent (``parts``/``data``: gguf >= 0.10)."""
    field = reader.fields.get(key)
    if field is None or not len(field.data):
        return ""
    return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")


@cache
def dequantizable_types() -> tuple[str, ...]:
    """Names of the ggml tensor types the ``gguf`` package de-quantizes (asked, not listed)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    names = []
    for qtype in GGMLQuantizationType:
        block_elems, block_bytes = GGML_QUANT_SIZES.get(qtype, (0, 0))
        if not block_bytes:
            continue
        try:
            dequantize(np.zeros((1, block_bytes), dtype=np.uint8), qtype)
        except NotImplementedError:
            continue
        except Exception:  # noqa: BLE001, S112 (any other failure: this type does not work here)
            continue
        names.append(qtype.name)
    return tuple(names)


def _model_type(architecture: str, name: str) -> str:
    if architecture == "llama" and "mistral" in name.lower():
        return "mistral"
    return ARCH_MODEL_TYPES.get(architecture, architecture)


def inspect_gguf(path: Path) -> GgufInfo:
    """Read ``path``'s header and tensor table; refuse what cannot become a decoder here.

    Memory-maps the file, so the time grows with the vocabulary, not with the weights.

    Raises:
        CorruptModel: Not a GGUF file, or a damaged or truncated one.
        UnsupportedModel: An architecture the decoder does not implement (names the supported).
        UnsupportedQuantization: Tensors of a type that cannot be de-quantized (names what works).
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(len(MAGIC))
    if head != MAGIC:
        what = "an empty file" if size == 0 else f"its first bytes are {head!r}, not {MAGIC!r}"
        raise CorruptModel(f"{path} is not a GGUF file ({what}); {GGUF_HINT}")
    try:
        check_header(path)  # the reader trusts declared counts: 2^40 array items hang it
    except HeaderDamaged as e:
        damaged = f"{path} is a damaged or truncated GGUF file ({size:,} bytes; {e}); {GGUF_HINT}"
        raise CorruptModel(damaged) from None
    try:
        reader = _reader(path)
        tensors = reader.tensors
        end = max((t.data_offset + int(t.n_bytes) for t in tensors), default=0)
        architecture = _string_field(reader, "general.architecture")
        name = _string_field(reader, "general.name") or path.stem
        split = reader.fields.get("split.count")  # llama.cpp's gguf-split parts
        parts = int(split.parts[split.data[0]][0]) if split is not None and len(split.data) else 1
    except _Truncated as e:
        raise CorruptModel(_truncated(path, e.end, size)) from None
    except Exception as e:  # the reader fails with ValueError, IndexError, UnicodeDecodeError...
        raise CorruptModel(
            f"{path} is a damaged or truncated GGUF file ({size:,} bytes; the reader stopped at: "
            f"{type(e).__name__}: {e}); {GGUF_HINT}"
        ) from e
    if end > size:
        raise CorruptModel(_truncated(path, end, size))
    if parts > 1:
        raise CorruptModel(
            f"{path} is part of a model split into {parts} files; merge them into one first: "
            f"llama-gguf-split --merge {path.name} merged.gguf"
        )
    model_type = _model_type(architecture, name)
    supported = model_config.SUPPORTED_MODEL_TYPES  # read now: families added later count
    if model_type not in supported:
        raise UnsupportedModel(
            f"{path} holds a {architecture or 'unnamed'!r} model (model_type {model_type!r}), which this "
            f"decoder does not implement; supported: {', '.join(supported)} "
            "(use a GGUF of one of those families)"
        )
    types = Counter(t.tensor_type.name for t in tensors)
    works = dequantizable_types()
    bad = sorted(t for t in types if t not in works and t not in ("F32", "F16"))
    if bad:
        raise UnsupportedQuantization(
            f"{path} stores tensors as {', '.join(bad)}, which cannot be de-quantized (the gguf package "
            f"{_gguf_version()} has no de-quantizer for it); use a GGUF quantised as one of F32, F16, "
            f"{', '.join(works)} (Q4_K_M, Q8_0 and F16 are the common ones)"
        )
    parameters = sum(int(t.n_elements) for t in tensors)
    return GgufInfo(path, architecture, model_type, name, dict(types), parameters)


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


# Where each step of a conversion starts, as a fraction of the whole, from SmolLM2's Q4_1 file
# on 2 CPU cores: reading 7 s, tokenizer 9 s, transformers' own read and model set-up 17 s,
# de-quantizing 3 s, writing 0.5 s.
TOKENIZER_AT, SETUP_AT, DEQUANTIZE_SPAN, WRITE_AT = 0.2, 0.45, (0.9, 0.97), 0.97


@contextmanager
def _tensor_progress(step: Step, kinds: str, span: tuple[float, float]) -> Iterator[None]:
    """Report transformers' GGUF de-quantizing, tensor by tensor, through ``step``.

    transformers shows it as a console tqdm bar only; for the UI's load bar its loader's
    ``tqdm`` is swapped, while this runs, for one that also calls ``step``. Without that
    attribute (another transformers version) the step stays coarse.
    """
    try:
        import transformers.modeling_gguf_pytorch_utils as loader
    except ImportError:
        yield
        return
    original = getattr(loader, "tqdm", None)
    if not isinstance(original, type):
        yield
        return
    start, stop = span

    class Reporting(original):  # type: ignore[misc, valid-type]
        def __iter__(self) -> Iterator[Any]:
            total = self.total or 1
            for done, item in enumerate(super().__iter__()):
                if done % max(1, total // 100) == 0:
                    what = f"de-quantizing tensor {done + 1}/{total} ({kinds})"
                    step(what, start + (stop - start) * done / total)
                yield item

    loader.tqdm = Reporting
    try:
        yield
    finally:
        loader.tqdm = original


def convert_gguf(gguf: Path, dest: Path, step: Step, info: GgufInfo | None = None) -> GgufInfo:
    """De-quantize ``gguf`` into a new Hugging Face folder ``dest`` (fp32 safetensors + tokenizer).

    ``dest`` must not exist; on failure it may hold part of the output, so write into a
    temporary folder and rename it (as the store does). ``info``: what :func:`inspect_gguf`
    said of the file already (it is not read twice).

    Raises:
        CorruptModel, UnsupportedModel, UnsupportedQuantization: From :func:`inspect_gguf`, or
            transformers failed on a file that looked intact.
    """
    if info is None:
        step(f"reading {gguf.name}", 0.0)
        info = inspect_gguf(gguf)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kinds = ", ".join(f"{n} {k}" for k, n in sorted(info.tensor_types.items()))
    try:
        step(f"building the tokenizer of {gguf.name}", TOKENIZER_AT)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        step(f"transformers reading {gguf.name} and setting up the model", SETUP_AT)
        with _tensor_progress(step, kinds, DEQUANTIZE_SPAN):
            model = AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
    except MemoryError:
        raise
    except OSError as e:
        raise CorruptModel(f"cannot read {gguf} ({e}); check the file and the disk it is on") from e
    except Exception as e:  # transformers' GGUF loader raises ValueError, KeyError, RuntimeError...
        raise CorruptModel(
            f"transformers could not convert {gguf} ({type(e).__name__}: {e}); the file may be damaged "
            f"or of a layout transformers does not read: {GGUF_HINT}"
        ) from e
    # The weights are de-quantized already; a plain folder must not claim to be GGUF.
    setattr(model, "hf_quantizer", None)  # noqa: B010 (typed as non-optional)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    step(f"writing {info.fp32_bytes / 1e6:,.0f} MB of fp32 safetensors", WRITE_AT)
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    try:
        DecoderConfig.from_dir(dest)
    except InvalidConfig as e:
        raise UnsupportedModel(f"{gguf} converted to a config this decoder cannot use: {e}") from e
    if not (dest / "tokenizer.json").is_file() or not getattr(tokenizer, "chat_template", None):
        raise UnsupportedModel(
            f"{gguf} has no chat template (tokenizer.chat_template); use an instruct/chat GGUF"
        )
    logger.info("converted %s into %s", gguf, dest)
    step("converted", 1.0)
    return info

"""What every decoder backend offers: the :class:`Decoder` protocol and its value types."""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from engines.bounds import bounds, check_bounds


class ContextOverflow(ValueError):
    """The prompt does not fit in the decoder's KV-cache capacity."""


class Backend(enum.StrEnum):
    """Which kind of engine decodes (``--backend``; ``remote`` is ``--llm-server``)."""

    PYTORCH = "pytorch"
    ONNXRUNTIME = "onnxruntime"
    TENSORRT = "tensorrt"
    TENSORRT_RTX = "tensorrt-rtx"
    REMOTE = "remote"


@dataclass(frozen=True)
class BackendIdentity:
    """What a decoder is, as data: callers read these fields, never a parsed display name.

    Attributes:
        backend: The kind of engine.
        device: ``cpu`` or ``cuda`` (``""`` for a served decoder: the server's device).
        precision: ``fp32``, ``fp16``, ``bf16``, ``int8``... (``""`` for a served decoder).
        variant: How a PyTorch step runs on the GPU: ``static``, ``cuda-graph``,
            ``cuda-graph+compile`` (``""``: eager, or another backend).
        version: The TensorRT (-RTX) version that runs the engine, else ``""``.
        address: The server's URL of a served decoder, else ``""``.
    """

    backend: Backend
    device: str = ""
    precision: str = ""
    variant: str = ""
    version: str = ""
    address: str = ""

    @property
    def label(self) -> str:
        """The short name (``pytorch-cpu``, ``onnxruntime-cpu``, ``tensorrt-rtx``, ``server``).

        The first word of :meth:`describe`, and the ``backend`` label of the metrics.
        """
        if self.backend in (Backend.PYTORCH, Backend.ONNXRUNTIME):
            return f"{self.backend}-{self.device}"
        return "server" if self.backend is Backend.REMOTE else str(self.backend)

    def describe(self) -> str:
        """The display name: ``pytorch-cuda fp16 cuda-graph``, ``tensorrt fp16``, ``server URL``."""
        if self.backend is Backend.REMOTE:
            return f"server {self.address}"
        return " ".join(w for w in (self.label, self.precision, self.variant) if w)


@dataclass(frozen=True)
class GenerationOptions:
    """How to pick tokens and when to stop.

    ``temperature == 0`` is greedy decoding; top-k, top-p and the seed then do nothing.
    """

    max_new_tokens: int = field(default=256, metadata=bounds(min=1, max=131072))
    temperature: float = field(default=0.0, metadata=bounds(min=0.0))
    top_k: int = field(default=0, metadata=bounds(min=0))
    top_p: float = field(default=1.0, metadata=bounds(above=0.0, max=1.0))
    repetition_penalty: float = field(default=1.0, metadata=bounds(above=0.0))
    seed: int | None = field(default=None, metadata=bounds(min=0, max=2**64 - 1))
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_bounds(self)  # e.g. a repetition penalty of 0 would divide by zero


class StopReason(enum.Enum):
    """Why a generation ended."""

    EOS = "eos"
    STOP_STRING = "stop_string"
    MAX_TOKENS = "max_tokens"
    CONTEXT_FULL = "context_full"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class TokenChunk:
    """One generated token and the text it made printable.

    ``text`` may be empty (a token inside a multi-byte character, or text held back because
    it may begin a stop string). ``t_ns`` is ``time.monotonic_ns()`` once the token id is on
    the host.
    """

    index: int
    token_id: int
    text: str
    t_ns: int


@dataclass
class GenerationStats:
    """Counts and timestamps of one generation (all ``monotonic_ns``).

    TTFT starts when the prompt is submitted (``t_submit_ns``) and stops when the first
    token id is on the host (``t_first_token_ns``); decode rate counts the tokens after it.
    """

    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefilled_tokens: int = 0
    generated_tokens: int = 0
    t_submit_ns: int = 0
    t_first_token_ns: int = 0
    t_done_ns: int = 0
    stop_reason: StopReason | None = None
    text: str = ""
    # A served decoder (--llm-server): the part of TTFT spent outside the server's model
    # (network, gRPC, Triton's queue), i.e. client TTFT - the server's own arrival -> token.
    network_ms: float | None = None

    @property
    def ttft_ms(self) -> float | None:
        """Prompt submitted -> first token id on the host; ``None`` if no token came."""
        if not self.t_first_token_ns:
            return None
        return (self.t_first_token_ns - self.t_submit_ns) / 1e6

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first per second, as the consumer saw them (0 when there are none).

        The span runs from the first to the last token, so it includes the consumer's time
        between tokens (printing, TTS): the rate a user observes, not a kernel benchmark.
        """
        span_ns = self.t_done_ns - self.t_first_token_ns
        if self.generated_tokens < 2 or span_ns <= 0:
            return 0.0
        return (self.generated_tokens - 1) / (span_ns / 1e9)


class StepModel(Protocol):
    """The only part a backend implements: run tokens at a position, return last logits.

    ``identity`` says what runs the step; ``name`` is its display form (``identity.describe()``
    for the bundled backends).
    """

    name: str
    capacity_tokens: int
    identity: BackendIdentity

    def forward(self, token_ids: Sequence[int], start_pos: int) -> np.ndarray:
        """Write K/V of ``token_ids`` at ``start_pos...`` and return the last token's fp32 logits."""
        ...

    def close(self) -> None:
        """Release what the step holds beyond Python's memory (GPU memory, caches to save); idempotent."""
        ...


@runtime_checkable
class TokenStepModel(StepModel, Protocol):
    """A step model that can also choose the next token on its device (the fast path).

    Only the chosen id then crosses to the host. The rule is the driver's
    :class:`GenerationOptions`, applied as :class:`~engines.sampling.Sampler` does; greedy
    choices are identical to the host's, seeded sampling draws from another RNG.
    """

    def begin_choosing(self, options: GenerationOptions) -> bool:
        """Take the rule for the next generation; False means: use ``forward`` and the host."""
        ...

    def forward_token(self, token_ids: Sequence[int], start_pos: int) -> int:
        """Like ``forward``, but return the id chosen from the last token's logits."""
        ...


class Decoder(Protocol):
    """A stateful decoder holding one conversation's KV cache.

    Besides decoding, it says what it is and how it got ready, as the UI, the turn records
    and the metrics show it: ``identity`` (backend, device, precision as data), ``fallback``
    (why ``--backend auto`` runs it instead of the TensorRT it picked; ``""`` when it did
    not fall back) and ``cache_status`` (what start-up reused or made: ``engine cache hit``,
    ``ONNX exported in 14 s``, ``eager, nothing to cache``).
    """

    name: str
    capacity_tokens: int

    @property
    def identity(self) -> BackendIdentity:
        """What decodes, as data."""
        ...

    @property
    def fallback(self) -> str:
        """Why ``--backend auto`` fell back to this backend; ``""`` when it did not."""
        ...

    @property
    def cache_status(self) -> str:
        """What start-up reused or had to make, in words (the UI's ``engine:`` line)."""
        ...

    @property
    def cached_ids(self) -> Sequence[int]:
        """The token ids the KV cache holds (the conversation so far)."""
        ...

    def close(self) -> None:
        """Release the backend's resources (GPU memory, connections); idempotent."""
        ...

    def reset(self) -> None:
        """Forget the cached prefix."""
        ...

    def prefill(self, prompt_ids: Sequence[int]) -> np.ndarray:
        """Make the cache hold ``prompt_ids`` (reusing the common prefix); return last logits."""
        ...

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token; return its logits."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[int],
        options: GenerationOptions,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """Start a generation; lazy: nothing runs until the result is iterated."""
        ...


class Generation(Protocol):
    """A lazy stream of :class:`TokenChunk`; ``stats`` is complete once it is exhausted."""

    stats: GenerationStats

    def __iter__(self) -> Iterator[TokenChunk]:
        """Run the generation, yielding each token as it is produced."""
        ...

"""What an engine is built for: precision, targets, workspace and optimization profiles.

Pure data (no TensorRT import), so the settings tree and the CLI can use it anywhere. The
profiles follow the export's graph contract (``docs/engines.md``): profile 0 serves prefill
(``sequence`` ``prefill_min_tokens..prefill_max_tokens``, ``past_sequence`` 0 up to
``context_max_tokens - 1``), profile 1 serves decode (``sequence`` 1). A prompt longer than
``prefill_max_tokens`` is prefilled in chunks, so the maximum can follow real traffic (P99 of
prompt lengths, ``assistant engine profile``) instead of reserving for the worst case.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from engines.bounds import bounds

FLAVOURS = ("tensorrt", "tensorrt-rtx")
PRECISIONS = ("fp16", "bf16", "fp32", "int8")
MIN_WORKSPACE_MIB = 1024  # the source article's floor: smaller pools starve fused attention tactics


class EngineOptionsError(ValueError):
    """Build options that cannot describe an engine (bad profile bounds, precision, workspace)."""


@dataclass(frozen=True)
class EngineOptions:
    """How TensorRT engines are built and run (the ``[engine]`` settings section).

    Attributes:
        flavour: ``auto`` (full TensorRT when importable, else TensorRT-RTX), ``tensorrt`` or
            ``tensorrt-rtx``.
        precision: ``fp16`` (default), ``bf16``, ``fp32`` or ``int8`` (see ``flavour.py`` for
            what each flavour supports).
        targets: TensorRT-RTX compute capabilities, comma separated (``sm89``, ``sm86,sm120``);
            ``auto`` is the GPU of this machine. Full TensorRT always builds for the GPU it runs on.
        workspace_mib: Builder memory-pool (workspace) limit, at least 1024 MiB.
        optimization_level: Builder optimization level 0-5 (TensorRT's default is 3).
        prefill_min_tokens: Shortest prefill chunk the prefill profile accepts.
        prefill_opt_tokens: Prefill length the kernels are tuned for (typical new tokens of a turn).
        prefill_max_tokens: Longest prefill chunk; longer prompts are prefilled in chunks.
        context_opt_tokens: Typical KV-cache length (past tokens) the kernels are tuned for.
        context_max_tokens: Largest KV cache the engine accepts (past + new tokens).
        decode_profile: A second optimization profile for decode (``sequence`` 1). ``None``: the
            flavour decides (TensorRT yes, autotuned separately; TensorRT-RTX no: it stored the
            weights once per profile, 499 MB against 276 MB for SmolLM2 fp16, and specializes
            kernels per shape at run time anyway).
        cuda_graphs: Replay decode steps as CUDA graphs (TensorRT-RTX: its built-in strategy;
            TensorRT: a capture per decode shape, reused when the shape comes back).
        warmup: Run the profile's typical shapes once at load, before the first user turn.
    """

    flavour: str = "auto"
    precision: str = "fp16"
    targets: str = "auto"
    workspace_mib: int = field(default=1024, metadata=bounds(min=MIN_WORKSPACE_MIB))
    optimization_level: int = field(default=3, metadata=bounds(min=0, max=5))
    prefill_min_tokens: int = field(default=1, metadata=bounds(min=1))
    prefill_opt_tokens: int = field(default=128, metadata=bounds(min=1))
    prefill_max_tokens: int = field(default=512, metadata=bounds(min=1))
    context_opt_tokens: int = field(default=512, metadata=bounds(min=0))
    context_max_tokens: int = field(default=2048, metadata=bounds(min=2, max=131072))
    decode_profile: bool | None = None
    cuda_graphs: bool = False
    warmup: bool = True

    def validate(self) -> None:
        """Check the options describe a buildable engine.

        Raises:
            EngineOptionsError: Naming the bad value and the valid range.
        """
        if self.flavour not in ("auto", *FLAVOURS):
            raise EngineOptionsError(
                f"engine flavour {self.flavour!r} unknown; use auto, {', '.join(FLAVOURS)}"
            )
        if self.precision not in PRECISIONS:
            raise EngineOptionsError(f"precision {self.precision!r} unknown; use {', '.join(PRECISIONS)}")
        if self.workspace_mib < MIN_WORKSPACE_MIB:
            raise EngineOptionsError(
                f"workspace_mib {self.workspace_mib} is below the {MIN_WORKSPACE_MIB} MiB minimum"
            )
        if not 0 <= self.optimization_level <= 5:
            raise EngineOptionsError(f"optimization_level {self.optimization_level} not in 0..5")
        if not 1 <= self.prefill_min_tokens <= self.prefill_opt_tokens <= self.prefill_max_tokens:
            raise EngineOptionsError(
                "prefill profile needs 1 <= min <= opt <= max, got "
                f"{self.prefill_min_tokens}/{self.prefill_opt_tokens}/{self.prefill_max_tokens}"
            )
        if self.prefill_max_tokens > self.context_max_tokens:
            raise EngineOptionsError(
                f"prefill_max_tokens {self.prefill_max_tokens} exceeds "
                f"context_max_tokens {self.context_max_tokens}"
            )
        if not 0 <= self.context_opt_tokens < self.context_max_tokens:
            raise EngineOptionsError(
                f"context_opt_tokens {self.context_opt_tokens} must be in 0..context_max_tokens - 1"
            )

    def target_list(self) -> tuple[str, ...]:
        """``targets`` as a tuple of lower-case names (``("sm89",)``; ``("auto",)``)."""
        return tuple(t.strip().lower() for t in self.targets.split(",") if t.strip())

    def profile_record(self) -> dict[str, Any]:
        """The profile bounds as recorded with an engine (and hashed into its key)."""
        keys = [k for k in asdict(self) if k.startswith(("prefill_", "context_"))]
        keys.append("decode_profile")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class ShapeRange:
    """min / opt / max of one tensor in one optimization profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def profile_shapes(
    options: EngineOptions, num_kv_heads: int, head_dim: int, decode_profile: bool
) -> list[dict[str, ShapeRange]]:
    """Shapes of the prefill profile (0) and, with ``decode_profile``, the decode profile (1).

    Each is keyed ``ids`` (``input_ids`` and ``position_ids``) and ``past`` (every
    ``past_key_values`` input). Without a decode profile, decode runs on profile 0, whose
    shortest sequence is then 1.
    """
    o = options
    last = o.context_max_tokens - 1  # room for at least the token being run

    def past(lo: int, opt: int, hi: int) -> ShapeRange:
        return ShapeRange(
            (1, num_kv_heads, lo, head_dim), (1, num_kv_heads, opt, head_dim), (1, num_kv_heads, hi, head_dim)
        )

    shortest = o.prefill_min_tokens if decode_profile else 1
    prefill = {
        "ids": ShapeRange((1, shortest), (1, o.prefill_opt_tokens), (1, o.prefill_max_tokens)),
        "past": past(0, min(o.context_opt_tokens, last), last),
    }
    if not decode_profile:
        return [prefill]
    decode = {
        "ids": ShapeRange((1, 1), (1, 1), (1, 1)),
        "past": past(0, min(o.context_opt_tokens, last), last),
    }
    return [prefill, decode]

"""Engine options small enough to build a real TensorRT-RTX engine on the CPU in seconds."""

from __future__ import annotations

from engines.tensorrt.options import EngineOptions

TINY = EngineOptions(
    targets="sm89",
    prefill_opt_tokens=16,
    prefill_max_tokens=64,
    context_opt_tokens=64,
    context_max_tokens=256,
)

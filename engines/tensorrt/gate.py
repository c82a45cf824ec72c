"""The start-up accuracy gate: a TensorRT engine against the PyTorch reference before its first use.

The source article's rule (an end-to-end regression against the unoptimized model before an
engine ships) applied where engines are made: at the first start that built or found an engine.
:func:`run_gate` runs :func:`~engines.verify.verify_decoder` on a few of the fixed dialogues
(``[gate]`` settings, :class:`~engines.verify.GateOptions`) with PyTorch fp32 as the reference,
on the same CUDA GPU when the fp32 weights fit beside the engine, else on the CPU, and frees the
reference afterwards. The verdict is stored in the engine's record (``engine.json``
``verified``), so later starts skip the gate, and an engine that failed is not checked again:
:func:`prior_verdict` finds it for the same thresholds.
"""

from __future__ import annotations

import datetime
import gc
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from engines import verify
from engines.driver import DecoderDriver
from engines.progress import ProgressCallback, Stage, emit
from engines.tensorrt import cache

logger = logging.getLogger(__name__)

REFERENCE_CAPACITY_TOKENS = 1024  # a gate dialogue: system prompt + question + reply
HEADROOM_BYTES = 512 << 20  # activations, KV cache and the allocator's slack beside the weights


class GateFailed(RuntimeError):
    """The engine missed the accuracy gate's thresholds, now or at an earlier start.

    ``verdict`` is the record stored with the engine (:meth:`~engines.verify.VerifyReport.to_record`).
    """

    def __init__(self, message: str, verdict: dict[str, Any]) -> None:
        super().__init__(message)
        self.verdict = verdict


def prior_verdict(record: dict[str, Any], options: verify.GateOptions) -> dict[str, Any] | None:
    """The verdict stored with an engine for these thresholds; ``None``: not checked against them."""
    verified = record.get("verified")
    if not isinstance(verified, dict) or verified.get("thresholds") != asdict(options.thresholds()):
        return None
    return verified


def reference_device(model_dir: Path) -> str:
    """Where the fp32 reference runs: ``cuda`` when it fits, else ``cpu``.

    It fits when PyTorch sees a GPU with twice a 16-bit checkpoint's size free (the fp32
    weights), plus :data:`HEADROOM_BYTES`.
    """
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    weights = sum(p.stat().st_size for p in model_dir.glob("*.safetensors"))
    free_bytes, _ = torch.cuda.mem_get_info()
    return "cuda" if 2 * weights + HEADROOM_BYTES <= free_bytes else "cpu"


def run_gate(
    candidate: DecoderDriver,
    model_dir: Path,
    tokenizer: Any,
    options: verify.GateOptions,
    *,
    engine_folder: Path | None = None,
    progress: ProgressCallback | None = None,
) -> verify.VerifyReport:
    """Judge ``candidate`` against PyTorch fp32 and store the verdict in ``engine_folder``'s record.

    Raises:
        GateFailed: A threshold was missed (the verdict is stored first).
    """
    from engines.torch_backend import TorchBackendOptions, load_torch_decoder

    device = reference_device(model_dir)
    emit(progress, Stage.GATE, f"accuracy gate: loading the PyTorch fp32 reference on {device}")
    reference_options = TorchBackendOptions(
        device=device, dtype="fp32", capacity_tokens=REFERENCE_CAPACITY_TOKENS, cuda_graph="off"
    )
    reference = load_torch_decoder(model_dir, tokenizer, reference_options)
    try:
        report = verify.verify_decoder(
            candidate,
            reference,
            tokenizer,
            prompts=verify.DIALOGUE[: options.prompts],
            max_new_tokens=options.max_new_tokens,
            thresholds=options.thresholds(),
            on_prompt=lambda done, total: emit(
                progress, Stage.GATE, f"accuracy gate: dialogue {done}/{total}"
            ),
        )
    finally:
        reference.close()
        del reference
        gc.collect()
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()  # the engine keeps the GPU to itself
    verdict = record_verdict(engine_folder, report, "start-up gate")
    logger.info("%s: accuracy gate %s", candidate.name, cache.gate_summary(verdict))
    if not report.passed:
        raise GateFailed(f"accuracy gate failed: {'; '.join(report.failures)}", verdict)
    return report


def record_verdict(folder: Path | None, report: verify.VerifyReport, checked_by: str) -> dict[str, Any]:
    """Store ``report`` as the ``verified`` field of the engine in ``folder`` (when there is one).

    Returns the verdict; a record that cannot be written is only a warning (the gate then runs
    again at the next start).
    """
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    verdict = {**report.to_record(), "checked_by": checked_by, "checked_at": now}
    if folder is not None:
        try:
            cache.update_record(folder, verified=verdict)
        except (OSError, ValueError) as e:
            logger.warning("cannot store the accuracy gate's verdict in %s: %s", folder, e)
    return verdict

"""The tensors of one TensorRT step: its GPU and pinned memory, and binding them to a context.

Two KV buffer sets sized for the whole context: ``past`` is bound to one and ``present`` to the
other, and they swap after each step (:class:`~engines.tensorrt.runtime.TensorRTStep`); the ids,
positions and logits on the device, with pinned host mirrors. Everything is allocated once, at
load, so a step never allocates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engines.onnx_export import INPUT_IDS, LAST_LOGITS, POSITION_IDS, past_names, present_names
from engines.tensorrt.cuda_mem import DeviceBuffer, PinnedArray
from models.config import DecoderConfig


class EngineRuntimeError(RuntimeError):
    """TensorRT failed while running the engine."""


class StepTensors:
    """Device buffers and pinned host arrays for ``capacity_tokens`` positions of ``config``'s cache.

    Args:
        config: The decoder's architecture (layers, KV heads, vocabulary).
        capacity_tokens: Positions of the KV cache (and of the id and position inputs).
        row_bytes: Bytes of one position of one KV head in the cache dtype.

    A failure half-way frees what was allocated before it re-raises.
    """

    def __init__(self, config: DecoderConfig, capacity_tokens: int, row_bytes: int) -> None:
        self.config = config
        self.past_names, self.present_names = past_names(config.num_layers), present_names(config.num_layers)
        self.kv: list[list[DeviceBuffer]] = [[], []]
        self.buffers: list[DeviceBuffer] = []
        self.pinned: list[PinnedArray] = []
        try:
            per_tensor = config.num_kv_heads * capacity_tokens * row_bytes
            for buffers in self.kv:
                for _ in self.past_names:
                    buffers.append(DeviceBuffer(per_tensor))
            self.ids = self._device(capacity_tokens * 8)
            self.positions = self._device(capacity_tokens * 8)
            self.logits = self._device(config.vocab_size * 4)
            # Pinned, one slot per cache position: the chunks of a long prompt each have their
            # own host bytes, so none is rewritten before its queued copy ran.
            self.host_ids = self._host(capacity_tokens, np.int64)
            self.host_positions = self._host(capacity_tokens, np.int64)
            self.host_logits = self._host(config.vocab_size, np.float32)
        except BaseException:
            self.free()
            raise

    def _device(self, nbytes: int) -> DeviceBuffer:
        buffer = DeviceBuffer(nbytes)
        self.buffers.append(buffer)
        return buffer

    def _host(self, count: int, dtype: type) -> PinnedArray:
        pinned = PinnedArray(count, dtype)
        self.pinned.append(pinned)
        return pinned

    def free(self) -> None:
        """Free every buffer and pinned array made so far."""
        for buffer in [*self.kv[0], *self.kv[1], *self.buffers]:
            buffer.free()
        for pinned in self.pinned:
            pinned.free()

    def bind(self, context: Any, current: int, count: int, past: int) -> None:
        """Shapes and addresses for a step of ``count`` tokens after ``past``, reading KV set ``current``.

        Raises:
            EngineRuntimeError: TensorRT refused a shape (outside the profile) or an address.
        """
        shape_past = (1, self.config.num_kv_heads, past, self.config.head_dim)
        _set_shape(context, INPUT_IDS, (1, count))
        _set_shape(context, POSITION_IDS, (1, count))
        _set_address(context, INPUT_IDS, self.ids.ptr)
        _set_address(context, POSITION_IDS, self.positions.ptr)
        for name, buffer in zip(self.past_names, self.kv[current], strict=True):
            _set_shape(context, name, shape_past)
            _set_address(context, name, buffer.ptr)
        for name, buffer in zip(self.present_names, self.kv[1 - current], strict=True):
            _set_address(context, name, buffer.ptr)
        _set_address(context, LAST_LOGITS, self.logits.ptr)


def _set_shape(context: Any, name: str, shape: tuple[int, ...]) -> None:
    if not context.set_input_shape(name, shape):
        raise EngineRuntimeError(
            f"TensorRT refused set_input_shape({name}, {shape}): outside the engine's "
            "optimization profile (its errors are logged above)"
        )


def _set_address(context: Any, name: str, ptr: int) -> None:
    if not context.set_tensor_address(name, ptr):
        raise EngineRuntimeError(
            f"TensorRT refused set_tensor_address({name}, {ptr:#x}) (its errors are logged above)"
        )

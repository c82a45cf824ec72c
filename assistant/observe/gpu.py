"""GPU utilisation and memory through nvidia-ml-py, when it and a GPU are present.

One reader for everything that shows the GPU: the UI's status line and memory trend, and
the Prometheus gauges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSample:
    """One reading of GPU 0: utilisation over NVML's last sample period, memory in bytes."""

    name: str
    utilization: float  # 0..1
    memory_used_bytes: int
    memory_total_bytes: int

    def summary(self) -> str:
        """``H200 util 73% mem 4.1/139.8 GiB``."""
        used, total = self.memory_used_bytes / 2**30, self.memory_total_bytes / 2**30
        return f"{self.name} util {100 * self.utilization:.0f}% mem {used:.1f}/{total:.1f} GiB"


class GpuUnreadable(RuntimeError):
    """NVML answered with an error (the GPU went away, or the driver reset)."""


class GpuMonitor:
    """Reads GPU 0's utilisation and memory; ``available`` is False without NVML or a GPU."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        self.name = ""
        try:
            import pynvml  # from nvidia-ml-py (the 'gpu' extras)

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.name = (name.decode() if isinstance(name, bytes) else name).removeprefix("NVIDIA ")
        except Exception as e:  # ImportError, or NVMLError without a driver or a GPU
            logger.debug("no GPU monitoring: %s", e)

    @property
    def available(self) -> bool:
        """Whether ``sample()`` has a GPU to read."""
        return self._handle is not None

    def sample(self) -> GpuSample | None:
        """GPU 0 now, or ``None`` without a GPU; :class:`GpuUnreadable` when NVML fails."""
        if self._handle is None:
            return None
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as e:  # NVMLError
            raise GpuUnreadable(str(e)) from e
        return GpuSample(self.name, util.gpu / 100.0, int(mem.used), int(mem.total))

    def reading(self) -> tuple[GpuSample | None, str]:
        """One read for everything shown: the sample (``None`` without one) and its status line.

        The line is ``H200 util 73% mem 4.1/139.8 GiB``, ``unreadable (why)`` when NVML
        fails, or empty without a GPU.
        """
        try:
            s = self.sample()
        except GpuUnreadable as e:
            return None, f"unreadable ({e})"
        return s, "" if s is None else s.summary()

    def read(self) -> str:
        """``H200 util 73% mem 4.1/139.8 GiB``, or an empty string when unavailable."""
        return self.reading()[1]

"""GPU utilisation and memory through nvidia-ml-py, when it and a GPU are present."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


class GpuMonitor:
    """Reads GPU 0's utilisation and memory; ``available`` is False without NVML or a GPU."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handle: Any = None
        self.name = ""
        try:
            import pynvml  # from nvidia-ml-py (the 'gpu' extra)

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.name = (name.decode() if isinstance(name, bytes) else name).removeprefix("NVIDIA ")
        except Exception as e:  # ImportError, or NVMLError without a driver or a GPU
            logger.debug("no GPU monitoring: %s", e)

    @property
    def available(self) -> bool:
        """Whether ``read()`` has a GPU to read."""
        return self._handle is not None

    def read(self) -> str:
        """``H200 util 73% mem 4.1/139.8 GiB``, or an empty string when unavailable."""
        if self._handle is None:
            return ""
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as e:  # NVMLError: the GPU went away or the driver reset
            return f"unreadable ({e})"
        return f"{self.name} util {util.gpu}% mem {mem.used / 2**30:.1f}/{mem.total / 2**30:.1f} GiB"

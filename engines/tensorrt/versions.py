"""The GPUs, drivers and cuda-python versions TensorRT runs with: facts the runtime and set-up share.

Standard library only and importing nothing: ``setup_gpu.py`` (run by ``scripts/setup.sh`` in a
fresh ``.venv`` before any dependency is installed) decides what to install by these, and the
runtime (:mod:`engines.tensorrt.flavour`, :mod:`engines.tensorrt.cuda_mem`,
:mod:`engines.selection`) checks the machine by the same ones.
"""

from __future__ import annotations

# From TensorRT-RTX 1.7.1's own refusal message on a 9.0 GPU ("Supported compute capabilities").
RTX_RUNNABLE = frozenset({(8, 0), (8, 6), (8, 9), (12, 0), (12, 1)})
TENSORRT_MIN_CAPABILITY = (7, 5)  # TensorRT 10 supports Turing and newer
# Oldest Linux driver per CUDA major (CUDA 12.0: 525.60.13, CUDA 13.0: 580.65.06).
CUDA_DRIVER_MIN = {13: (580, 65, 6), 12: (525, 60, 13)}
# The cuda-python pin per CUDA major: pyproject.toml's extras use the same (a test checks).
CUDA_PYTHON_PIN = {12: "cuda-python>=12.6.1,<13", 13: "cuda-python>=13,<14"}

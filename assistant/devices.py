"""Audio devices: listing them and finding the one a setting names (PortAudio via sounddevice)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class AudioDeviceError(RuntimeError):
    """No usable audio device, or the chosen one cannot be opened."""


@dataclass(frozen=True)
class DeviceInfo:
    """One PortAudio device."""

    index: int
    name: str
    inputs: int
    outputs: int
    default_rate_hz: float
    is_default_input: bool
    is_default_output: bool


def portaudio() -> Any:
    """The ``sounddevice`` module (PortAudio), or a clear error when it cannot load."""
    try:
        import sounddevice
    except OSError as e:  # the PortAudio shared library is missing
        raise AudioDeviceError(f"PortAudio not found ({e}): apt-get install libportaudio2") from e
    except ImportError as e:
        raise AudioDeviceError(f"the sounddevice package is missing ({e}): run scripts/setup.sh") from e
    return sounddevice


def list_devices() -> list[DeviceInfo]:
    """Every input and output device PortAudio reports."""
    sd = portaudio()
    try:
        devices = sd.query_devices()
        default_in, default_out = sd.default.device
    except sd.PortAudioError as e:
        raise AudioDeviceError(f"cannot list audio devices: {e}") from e
    return [
        DeviceInfo(
            i,
            d["name"],
            d["max_input_channels"],
            d["max_output_channels"],
            d["default_samplerate"],
            i == default_in,
            i == default_out,
        )
        for i, d in enumerate(devices)
    ]


def find_device(spec: str | None, kind: str) -> int | None:
    """Index of the device matching ``spec`` (index or name substring); None for the default.

    Raises:
        AudioDeviceError: Nothing matches, or there is no device of that kind at all.
    """
    devices = list_devices()
    usable = [d for d in devices if (d.inputs if kind == "input" else d.outputs) > 0]
    if not usable:
        raise AudioDeviceError(f"no audio {kind} device found (see 'assistant devices')")
    if spec is None or spec == "":
        return None
    if spec.isdigit():
        matches = [d for d in usable if d.index == int(spec)]
    else:
        matches = [d for d in usable if spec.lower() in d.name.lower()]
    if not matches:
        names = ", ".join(f"{d.index}: {d.name}" for d in usable)
        raise AudioDeviceError(f"no {kind} device matches {spec!r}; available: {names}")
    return matches[0].index

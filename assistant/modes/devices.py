"""``assistant devices``: the audio devices, with the default input and output marked."""

from __future__ import annotations


def devices_command() -> int:
    """Print one line a device; returns the exit status."""
    from assistant.stages.devices import list_devices

    devices = list_devices()
    if not devices:
        print("no audio devices found")
    for d in devices:
        marks = ("*in " if d.is_default_input else "") + ("*out" if d.is_default_output else "")
        print(
            f"{d.index:3} {d.name:40} in {d.inputs:2}  out {d.outputs:2}  {d.default_rate_hz:7.0f} Hz {marks}"
        )
    return 0

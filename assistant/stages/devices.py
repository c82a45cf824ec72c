"""Audio devices: listing and finding them, opening a stream, watching open ones (lost, reopened).

PortAudio reads its device list once, when it is initialised; a sound server or a card that
comes back is seen only after PortAudio is initialised again (:func:`rescan`), which closes
every open stream. :class:`DeviceWatch` therefore re-scans only while none of the watched
streams is open (the sound server went away: both are gone); a single lost device is
reopened on the device list PortAudio already has.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from assistant.events import AudioDeviceLost, AudioDeviceRestored, Event

logger = logging.getLogger(__name__)

WATCH_POLL_S = 0.1  # how often the watch looks at the devices: the lost notice comes this soon
WATCH_LATE_NS = 500_000_000  # a look this late means the process was starved: no stall verdict
WATCH_JOIN_S = 2.0  # at stop, how long to wait for an attempt stuck on a hung sound server
RETRY_FIRST_S = 0.5  # first reopen attempt after a loss; each failure doubles the wait...
RETRY_MAX_S = 5.0  # ...up to this


class AudioDeviceError(RuntimeError):
    """No usable audio device, or the chosen one cannot be opened."""


class DeviceLostError(AudioDeviceError):
    """An open device stopped working (the sound server went away, the card was unplugged)."""


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


def open_stream(
    kind: str, spec: str | None, rate_hz: int, block_ms: int, callback: Any, finished: Any
) -> tuple[Any, str, int]:
    """Open a mono float32 stream on the chosen device: at ``rate_hz``, else at the device's rate.

    ``finished`` is called (on PortAudio's thread) when the stream stops, also by itself.
    Returns the stream, the device name and the rate it runs at.

    Raises:
        AudioDeviceError: No such device, or PortAudio cannot open it (no sound server...).
    """
    sd = portaudio()
    device = find_device(spec, kind)
    try:
        info = sd.query_devices(device, kind)
    except sd.PortAudioError as e:  # no default device: e.g. PortAudio started without a server
        raise AudioDeviceError(f"no default audio {kind} device ({e})") from e
    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    try:
        check(device, channels=1, samplerate=rate_hz, dtype="float32")
    except sd.PortAudioError:
        rate_hz = int(info["default_samplerate"])
    stream_type = sd.InputStream if kind == "input" else sd.OutputStream
    try:
        stream = stream_type(
            device=device,
            channels=1,
            samplerate=rate_hz,
            dtype="float32",
            blocksize=rate_hz * block_ms // 1000,
            callback=callback,
            finished_callback=finished,
        )
    except sd.PortAudioError as e:
        raise AudioDeviceError(f"cannot open {kind} device {info['name']!r}: {e}") from e
    return stream, info["name"], rate_hz


def abandon_portaudio() -> None:
    """Let the process end without PortAudio's exit handler (a hung sound server).

    sounddevice's handler terminates PortAudio at exit, which closes every stream still
    open; a stream on a sound server that hangs (stopped, not dead) cannot be closed, so the
    process would never end. Its connection goes with the process instead.
    """
    sd = portaudio()
    atexit.unregister(sd._exit_handler)


_STREAMS: weakref.WeakSet[Any] = weakref.WeakSet()  # the device streams of this process


def register_stream(device: Any) -> None:
    """Count ``device`` (with an ``is_open()``) among this process's streams for :func:`rescan`."""
    _STREAMS.add(device)


def streams_open() -> bool:
    """Whether any device stream of this process is open (then PortAudio must not restart)."""
    return any(device.is_open() for device in list(_STREAMS))


def rescan() -> None:
    """Initialise PortAudio again, so that it sees devices (or a sound server) that came back.

    sounddevice's maintainers give ``_terminate()`` + ``_initialize()`` as the way to refresh
    the device list (python-sounddevice issue #125). Terminating closes every open stream:
    call it only with none open.

    Raises:
        AudioDeviceError: PortAudio did not start again.
    """
    sd = portaudio()
    try:
        sd._terminate()
    except sd.PortAudioError:
        pass  # not initialised: the last rescan's initialisation failed
    try:
        sd._initialize()
    except sd.PortAudioError as e:
        raise AudioDeviceError(f"PortAudio did not start again: {e}") from e


DEVICE_NAMES = {"input": "microphone", "output": "speaker"}


def device_notice(event: AudioDeviceLost | AudioDeviceRestored) -> str:
    """The one line a user reads about a lost or restored audio device (UI and stdout)."""
    what = DEVICE_NAMES.get(event.kind, event.kind)
    if isinstance(event, AudioDeviceLost):
        return f"audio: {what} lost ({event.device!r}: {event.reason}); reopening it when it is back"
    return f"audio: {what} back ({event.device!r}, after {event.down_ms / 1000:.1f} s)"


class Watched(Protocol):
    """An open device as :class:`DeviceWatch` sees it (``Microphone``, ``Speaker``)."""

    kind: str  # "input" or "output"
    name: str
    lost: threading.Event  # set by the device itself when its stream died
    lost_reason: str
    first_beat_ns: int  # when the stream's callback first ran since opening (0: not yet)

    def check_stall(self, now_ns: int) -> None:
        """Mark the device lost if its stream claims to run but delivers nothing."""
        ...

    def is_open(self) -> bool:
        """Whether a stream is open (a lost one is closed by :meth:`release`)."""
        ...

    def release(self) -> None:
        """Close the dead stream (idempotent)."""
        ...

    def reopen(self) -> None:
        """Open a new stream on the configured device; raises ``AudioDeviceError``."""
        ...


@dataclass
class _Outage:
    since_ns: int
    next_try_ns: int
    retry_s: float = RETRY_FIRST_S
    reopened: bool = False  # a new stream is open; back once its audio flows


class DeviceWatch:
    """Reports lost devices and reopens them, with backoff, on its own thread.

    Each lost device gives one :class:`~assistant.events.AudioDeviceLost` (within
    :data:`WATCH_POLL_S` of the stream dying, or of a stall being noticed), then reopen
    attempts after 0.5, 1, 2, 4, 5, 5... s, and :class:`~assistant.events.AudioDeviceRestored`
    once a reopened stream runs (its callback has run: audio flows again; one that opens
    but stays silent, or dies, counts as a failed attempt). ``turn_id()`` gives the turn the
    events are stamped with. ``stop()`` ends and joins the thread.
    """

    def __init__(
        self, devices: Sequence[Watched], emit: Callable[[Event], None], turn_id: Callable[[], int]
    ) -> None:
        self.devices = list(devices)
        self.emit = emit
        self.turn_id = turn_id
        self.outages: dict[int, _Outage] = {}  # by index into ``devices``
        self.last_poll_ns = 0
        self._stop = threading.Event()
        # A daemon: an attempt can hang in PortAudio for as long as a sound server hangs.
        self.thread = threading.Thread(target=self._run, name="device-watch", daemon=True)

    def start(self) -> None:
        """Start watching (no-op without devices)."""
        if self.devices:
            self.thread.start()

    def stop(self) -> None:
        """Stop watching and join the thread (an attempt in progress finishes first).

        An attempt stuck in PortAudio (a sound server that hangs) is waited for
        :data:`WATCH_JOIN_S`, then left behind, and PortAudio with it (:func:`abandon_portaudio`).
        """
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(WATCH_JOIN_S)
        if self.thread.is_alive():
            logger.warning("a sound device does not answer (a hung sound server?); not waiting for it")
            abandon_portaudio()

    def _run(self) -> None:
        while not self._stop.wait(WATCH_POLL_S):
            self.poll(time.monotonic_ns())

    def poll(self, now_ns: int) -> None:
        """One look: report new losses, retry the reopen of those due.

        When this look comes late, the whole process was probably starved (a loaded CPU, a
        long call holding the GIL): the audio callbacks were held up too, so a quiet stream
        is not called stalled this time.
        """
        punctual = now_ns - self.last_poll_ns <= WATCH_LATE_NS
        self.last_poll_ns = now_ns
        for i, device in enumerate(self.devices):
            outage = self.outages.get(i)
            if punctual and (outage is None or outage.reopened):
                device.check_stall(now_ns)
            if outage is None and device.lost.is_set():
                self.outages[i] = _Outage(now_ns, now_ns + int(RETRY_FIRST_S * 1e9))
                logger.info("%s device %r lost: %s", device.kind, device.name, device.lost_reason)
                self.emit(
                    AudioDeviceLost(self.turn_id(), now_ns, device.kind, device.name, device.lost_reason)
                )
            elif outage is not None and outage.reopened:
                if device.lost.is_set():  # opened, but silent or dead again: not back
                    logger.info("%s device not back yet: %s", device.kind, device.lost_reason)
                    outage.reopened = False
                    self._later([i])
                elif device.first_beat_ns:
                    del self.outages[i]
                    logger.info("%s device %r is back", device.kind, device.name)
                    down_ms = (now_ns - outage.since_ns) / 1e6
                    self.emit(AudioDeviceRestored(self.turn_id(), now_ns, device.kind, device.name, down_ms))
        due = [i for i, o in self.outages.items() if not o.reopened and o.next_try_ns <= now_ns]
        if due:
            self._attempt(due)

    def _attempt(self, due: list[int]) -> None:
        for i, outage in self.outages.items():  # every dead stream: only live ones count as open
            if not outage.reopened:
                self.devices[i].release()
        try:
            # A sound server that restarted is seen only by a fresh PortAudio, which closes
            # every stream of the process: only when none is open (not only ours).
            if not streams_open():
                rescan()
        except AudioDeviceError as e:
            logger.info("audio devices not back yet: %s", e)
            self._later(due)
            return
        for i in due:
            device = self.devices[i]
            try:
                device.reopen()
            except AudioDeviceError as e:
                logger.info("%s device not back yet: %s", device.kind, e)
                self._later([i])
                continue
            self.outages[i].reopened = True

    def _later(self, indices: list[int]) -> None:
        now_ns = time.monotonic_ns()
        for i in indices:
            outage = self.outages[i]
            outage.retry_s = min(outage.retry_s * 2, RETRY_MAX_S)
            outage.next_try_ns = now_ns + int(outage.retry_s * 1e9)

"""Text to speech: a pyttsx3 (espeak-ng) synthesizer on one owner thread (splitting: ``splitter.py``).

The optional Piper voice (``engine = "piper"``) is in :mod:`assistant.stages.tts_piper`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import tempfile
import threading
import time
import wave
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from assistant.config.sections import TtsOptions
from assistant.stages.streams import resample
from store.leftovers import sweep_dead_pid_folders

logger = logging.getLogger(__name__)

T = TypeVar("T")

INSTALL_HINT = "apt-get install libespeak-ng1 espeak-ng"
RENDER_TIMEOUT_S = 15.0  # espeak-ng renders ~100x faster than real time; this means it is stuck
WARM_UP_TEXT = "Ready."
TEMP_PREFIX = "assistant-tts-"  # + the pid: $TMPDIR/assistant-tts-<pid>-<random>/


class TtsError(RuntimeError):
    """espeak-ng failed to render a sentence, or the synthesizer is closed."""


class TtsUnavailable(TtsError):
    """pyttsx3 or espeak-ng cannot start (or the voice does not exist)."""


class Synthesizer:
    """Renders sentences to audio with pyttsx3's espeak-ng driver, on one owner thread.

    The owner thread is started here and makes every pyttsx3 call; :meth:`synthesize` and
    :meth:`voices` may be called from any thread: they queue the work and block for it.
    espeak-ng is one engine per process (pyttsx3 shares it), so use one Synthesizer at a
    time. :meth:`close` (or leaving the ``with`` block) finishes queued work and joins.

    Raises:
        TtsUnavailable: pyttsx3 or espeak-ng cannot start, or no voice matches.
    """

    def __init__(self, options: TtsOptions) -> None:
        self.options = options
        self._jobs: queue.Queue[tuple[Future[Any], Callable[[Any], Any]] | None] = queue.Queue()
        self._lock = threading.Lock()  # orders submissions against the stop sentinel
        self._closed = False
        # Named with the pid, so a start removes the folders of processes that are gone (SIGKILL).
        sweep_dead_pid_folders(Path(tempfile.gettempdir()), TEMP_PREFIX)
        self._folder = tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
        self._finished = threading.Event()  # set by espeak-ng's thread, via pyttsx3
        self._completed = False
        self._error: BaseException | None = None
        self._count = 0
        self._espeak_busy: Callable[[], int] = lambda: 0
        started: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="tts-owner", daemon=True)
        self._thread.start()
        try:
            started.result()
        except BaseException:
            # A failed start ended the thread; an interrupted wait (SIGTERM, Ctrl-C) did not:
            # the sentinel stops it once started, so the join returns and the folder goes.
            self._jobs.put(None)
            self._thread.join(timeout=2 * RENDER_TIMEOUT_S)
            self._folder.cleanup()
            raise

    def __enter__(self) -> Synthesizer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def synthesize(self, text: str) -> np.ndarray:
        """Render ``text``; blocks until its audio is ready.

        Returns:
            Mono float32 samples at ``options.sample_rate_hz``; empty for blank text.

        Raises:
            TtsError: espeak-ng did not render it, or the synthesizer is closed.
        """
        if not text.strip():
            return np.zeros(0, np.float32)
        return self._call(lambda engine: self._render(engine, text))

    def stream(self, text: str) -> Iterator[np.ndarray]:
        """``text`` as audio pieces as they are ready: one here (espeak-ng renders it whole)."""
        audio = self.synthesize(text)
        if audio.size:
            yield audio

    @property
    def description(self) -> str:
        """The engine and voice, as the status bar and the turn record show them."""
        return f"pyttsx3 {self.options.voice or 'default'}"

    def voices(self) -> list[str]:
        """Ids of the installed espeak-ng voices (``gmw/en-us``...)."""
        return self._call(lambda engine: [str(v.id) for v in engine.getProperty("voices")])

    def close(self) -> None:
        """Finish queued work, stop the owner thread and join it (idempotent)."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._jobs.put(None)
        self._thread.join(timeout=2 * RENDER_TIMEOUT_S)
        if self._thread.is_alive():  # only if pyttsx3's run loop never ended
            logger.error("the TTS owner thread is stuck in pyttsx3; leaving it behind")
        self._folder.cleanup()

    def _call(self, job: Callable[[Any], T]) -> T:
        future: Future[T] = Future()
        with self._lock:
            if self._closed:
                raise TtsError("the synthesizer is closed")
            self._jobs.put((future, job))
        return future.result()

    def _run(self, started: Future[None]) -> None:
        """The owner thread: open the engine, warm it up, then serve jobs until the sentinel."""
        try:
            engine = self._open_engine()
        except TtsUnavailable as e:
            started.set_exception(e)
            return
        tokens = [
            engine.connect("finished-utterance", self._on_finished),
            engine.connect("error", self._on_error),
        ]
        try:
            try:  # the first render also shows whether espeak-ng can produce audio at all
                self._render(engine, WARM_UP_TEXT)
            except TtsError as e:
                started.set_exception(TtsUnavailable(f"espeak-ng cannot render speech ({e}): {INSTALL_HINT}"))
                return
            started.set_result(None)
            while (item := self._jobs.get()) is not None:
                future, job = item
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(job(engine))
                    except Exception as e:  # the caller gets it; the thread serves the next job
                        future.set_exception(e)
        finally:
            for token in tokens:
                engine.disconnect(token)

    def _open_engine(self) -> Any:
        try:
            import pyttsx3
            import pyttsx3.drivers._espeak
            import pyttsx3.drivers.espeak

            engine = pyttsx3.init("espeak")
            self._espeak_busy = pyttsx3.drivers._espeak.IsPlaying
            voices = engine.getProperty("voices")
        except Exception as e:  # pyttsx3 raises bare RuntimeError / OSError when espeak-ng is missing
            raise TtsUnavailable(f"text to speech cannot start ({e}): {INSTALL_HINT}") from e
        # The driver print()s "Audio saved to ..." on every render, into the console UI; send
        # it to the debug log instead (redirecting sys.stdout would swallow other threads' output).
        pyttsx3.drivers.espeak.print = lambda *args, **_kw: logger.debug("%s", " ".join(map(str, args)))
        # A new pyttsx3 engine holds every command until its first run loop, which then sets
        # the voice and starts the loop back to back; the loop start "stops" espeak-ng if it is
        # still applying settings, and that stop later cancels a render. Let commands run now.
        self._wait_idle()
        engine.proxy.setBusy(False)
        if self.options.voice:
            engine.setProperty("voice", _pick_voice(voices, self.options.voice))
        engine.setProperty("rate", self.options.rate_wpm)
        engine.setProperty("volume", self.options.volume)
        return engine

    def _wait_idle(self) -> None:
        """Wait until espeak-ng has no command running (it runs them on its own thread)."""
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        while self._espeak_busy():
            if time.monotonic() > deadline:
                raise TtsError("espeak-ng stays busy")
            time.sleep(0.001)

    def _render(self, engine: Any, text: str) -> np.ndarray:
        self._count += 1
        path = Path(self._folder.name) / f"{self._count}.wav"
        self._wait_idle()  # see _open_engine: a loop started while espeak-ng is busy cancels
        self._finished.clear()
        self._error = None
        engine.save_to_file(text, str(path))
        engine.runAndWait()  # may return before the file is written (pyttsx3 2.99)
        if not self._finished.wait(RENDER_TIMEOUT_S) or not self._completed:
            raise TtsError(f"espeak-ng did not finish rendering {text[:40]!r}") from self._error
        # finished-utterance is notified inside espeak-ng's synthesis callback, which then
        # still appends to pyttsx3's buffer: the next render must not start before it returns.
        self._wait_idle()
        try:
            audio, rate_hz = _read_wav(path)
        finally:
            path.unlink(missing_ok=True)
        return resample(audio, rate_hz, self.options.sample_rate_hz)

    def _on_finished(self, name: object = None, completed: bool = True) -> None:
        self._completed = completed
        self._finished.set()

    def _on_error(self, name: object = None, exception: BaseException | None = None) -> None:
        self._error = exception


def _pick_voice(voices: list[Any], wanted: str) -> str:
    """The id of the voice ``wanted`` names: exactly, by the part after ``/``, or by a substring."""
    w = wanted.lower()
    ids = [(str(v.id), str(v.id).lower(), str(v.name).lower()) for v in voices]
    exact = [i for i, vid, name in ids if w in (vid, vid.rsplit("/", 1)[-1], name)]
    partial = [i for i, vid, name in ids if w in vid or w in name]
    if not exact + partial:
        raise TtsUnavailable(f"no espeak-ng voice matches {wanted!r}; Synthesizer.voices() lists them")
    return (exact + partial)[0]


def _read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono float32 samples and rate of a 16-bit WAV, once it is completely written."""
    deadline = time.monotonic() + 1.0
    while True:
        with contextlib.suppress(OSError, EOFError, wave.Error), wave.open(str(path), "rb") as w:
            rate_hz, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            data = w.readframes(w.getnframes())
            if width == 2 and len(data) == w.getnframes() * width * channels:
                samples = np.frombuffer(data, "<i2").reshape(-1, channels)
                return samples.mean(axis=1, dtype=np.float32) / np.float32(32768), rate_hz
        if time.monotonic() > deadline:
            raise TtsError(f"espeak-ng wrote no complete 16-bit WAV to {path}")
        time.sleep(0.005)

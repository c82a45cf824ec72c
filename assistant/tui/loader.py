"""The loader thread: builds the session off the UI thread, then wires it to a live loop.

It talks to the UI only through ``post`` (the app's thread-safe ``post_message``);
quitting while it runs sets the cancel flag, and the build stops at its next step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from textual.message import Message

from assistant.app import LoadCancelled, Progress, Session
from assistant.events import Event
from assistant.stages.audio import AudioSink, FileSink
from assistant.tui.messages import LoadFailed, LoadProgress, SessionReady
from assistant.turns.live import LiveLoop

Builder = Callable[[Callable[[Event], None], Progress, threading.Event], Session]
"""Builds the session from the UI's event callback, progress callback and cancel flag
(runs on the loader thread; raises :class:`LoadCancelled` once the flag is set)."""


def make_loop(session: Session, input_wav: Path | None, emit: Callable[[Event], None]) -> LiveLoop:
    """The live loop over ``session``'s devices; with ``--input`` and no speaker, replies are rendered."""
    speaker: AudioSink | None = session.speaker
    if speaker is None and input_wav is not None and session.synthesizer is not None:
        speaker = FileSink()  # replay without a speaker: the reply is rendered, not played
    endpointer = session.endpointer() if session.mic is not None else None
    return LiveLoop(
        session.pipeline, session.mic, speaker, endpointer, emit, session.settings_turn, session.duplex
    )


class SessionLoader(threading.Thread):
    """Builds the session; reports progress and the result as messages.

    Args:
        build: Builds the session (see :data:`Builder`).
        emit: The pipeline's event callback.
        cancel: Set to stop the build at its next step.
        post: Posts a message to the UI (thread-safe).
        ready: Called on this thread with the built session, before :class:`SessionReady`
            is posted; what it raises is reported as :class:`LoadFailed`.
    """

    def __init__(
        self,
        build: Builder,
        emit: Callable[[Event], None],
        cancel: threading.Event,
        post: Callable[[Message], object],
        ready: Callable[[Session], None],
    ) -> None:
        super().__init__(name="session-loader", daemon=True)
        self.build, self.emit, self.cancel, self.post, self.ready = build, emit, cancel, post, ready

    def run(self) -> None:
        """Build, hand the session over, say so (or say what failed)."""
        try:
            session = self.build(self.emit, self._progress, self.cancel)
            if self.cancel.is_set():  # quit came as the last step finished
                session.close()
                raise LoadCancelled("cancelled")
            self.ready(session)
        except Exception as e:  # shown to the user; the app stays up for text or quit
            self.post(LoadFailed(e))
            return
        self.post(SessionReady(session.info(), session, tuple(session.notices)))

    def _progress(self, step: str, fraction: float) -> None:
        self.post(LoadProgress(step, fraction))

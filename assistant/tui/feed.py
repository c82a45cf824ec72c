"""The pipeline's events on screen: queued by any thread, drained by the UI a few times a second."""

from __future__ import annotations

import gc
from collections import deque

from assistant.app import set_aside_from_the_collector
from assistant.events import AudioDeviceLost, AudioDeviceRestored, Event, TurnDone
from assistant.observe.latency import TurnRecord, build_record
from assistant.stages.devices import device_notice
from assistant.tui.breakdown import LatencyBreakdown
from assistant.tui.conversation import Conversation
from assistant.tui.fold import TurnFold
from assistant.tui.keys import KeyActions
from assistant.tui.messages import PipelineEvent
from assistant.tui.stats import SessionStats
from assistant.tui.status import StatusBar

DRAIN_HZ = 20  # how often pipeline events reach the screen
NO_FULL_PASSES = 1_000_000_000  # middle passes before the collector's own full pass: never, in effect
RECOLLECT_FROZEN_EVERY_TURNS = 50  # turns between full passes that unfreeze first (what died since is freed)


class TurnFeed(KeyActions):
    """The inbox of pipeline events and what the UI makes of them: turns, records, device losses."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[TurnRecord] = []
        self.fold = TurnFold()
        self._inbox: deque[Event] = deque()
        self._thresholds: tuple[int, int, int] | None = None

    def start_drain(self) -> None:
        """Drain the inbox :data:`DRAIN_HZ` times a second from now on; full collections between turns.

        The garbage collector's full passes walk everything it tracks with the GIL held: in
        the middle of a reply they held it 50-76 ms, near what underruns the speaker. While
        the UI runs the collector makes none by itself (its young passes go on); each
        finished turn makes one (:meth:`turn_done`). :meth:`stop_drain` puts it back.
        """
        self.set_interval(1 / DRAIN_HZ, self._drain)
        if self._thresholds is None:
            self._thresholds = gc.get_threshold()
            gc.set_threshold(self._thresholds[0], self._thresholds[1], NO_FULL_PASSES)

    def stop_drain(self) -> None:
        """The collector as it was before :meth:`start_drain` (the app is going)."""
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None

    def emit(self, event: Event) -> None:
        """The pipeline's event callback (any thread): queued for the UI's next drain."""
        self._inbox.append(event)  # deque.append is thread-safe

    def on_pipeline_event(self, message: PipelineEvent) -> None:
        """An event posted as a message (tests, snapshots): shown at once."""
        self._inbox.append(message.event)
        self._drain()

    def _drain(self) -> None:
        """Fold the events that came since the last drain into the conversation, breakdown, status.

        The pipeline's threads only append to the inbox (``emit``); the UI drains it
        :data:`DRAIN_HZ` times a second rather than being woken for every token, which
        would take the GIL from the decode loop each time.
        """
        if not self._inbox or not self.is_running:
            return
        live: int | None = None
        status, conversation = self.query_one(StatusBar), self.query_one(Conversation)
        while self._inbox:
            event = self._inbox.popleft()
            if isinstance(event, TurnDone) and isinstance(event.record, TurnRecord):
                self.turn_done(event.record)
                live = None if live == event.turn_id else live
            elif isinstance(event, AudioDeviceLost | AudioDeviceRestored):
                self.fold.apply(event, status, conversation)
                lost = isinstance(event, AudioDeviceLost)
                self.notify(
                    device_notice(event), title="sound device", severity="warning" if lost else "information"
                )
                status.set(state=self._idle_state())
            elif self.fold.apply(event, status, conversation):
                live = event.turn_id
        conversation.flush()
        if live is not None and live in self.turn_events:
            self.query_one(LatencyBreakdown).show(self._live_record(live), done=False)

    @property
    def turn_events(self) -> dict[int, list[Event]]:
        """The events so far of each turn in flight."""
        return self.fold.turn_events

    def _live_record(self, turn: int) -> TurnRecord:
        return build_record(turn, self.turn_events.get(turn, []))

    def turn_done(self, record: TurnRecord) -> None:
        """A finished turn: last-turn breakdown, statistics, back to idle; garbage collected.

        The full collection kept from the middle of replies (:meth:`start_drain`) runs here,
        once the turn's reply has played, over what is new since the last turn (~1,000 objects
        a conversation entry: its rendered lines and their caches); what is left is frozen, so
        the next one does not walk it again (:func:`set_aside_from_the_collector`).
        """
        self.turn_events.pop(record.turn_id, None)
        self.records.append(record)
        self.query_one(LatencyBreakdown).show(record, done=True)
        self.query_one(SessionStats).update_records(self.records)
        self.query_one(StatusBar).set(state=self._idle_state())
        set_aside_from_the_collector(everything=len(self.records) % RECOLLECT_FROZEN_EVERY_TURNS == 0)

"""How the UI folds pipeline events into the conversation and the status bar, turn by turn."""

from __future__ import annotations

from assistant.events import (
    AudioDeviceLost,
    AudioDeviceRestored,
    AudioReady,
    BargeIn,
    CancelReason,
    EchoMeasured,
    EchoState,
    Event,
    MicLevel,
    OverlapHeard,
    OverlapVerdict,
    PartialTranscript,
    ReplyPaused,
    ReplyResumed,
    SpeculationConfirmed,
    SpeculationDiscarded,
    SpeculationStarted,
    SpeechEnded,
    SpeechOnset,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TokenGenerated,
    TranscriptReady,
    TurnCancelled,
    TurnHeld,
)
from assistant.stages.devices import device_notice
from assistant.tui.conversation import Conversation
from assistant.tui.status import StatusBar


class TurnFold:
    """The turns in flight: their events so far, and speculative reply text held back.

    A speculative reply (``SpeculationStarted``) is shown only once its turn is confirmed
    (``SpeechEnded`` / ``SpeculationConfirmed``), and dropped if the user went on. A turn cut
    for length (``TurnHeld``) shows its words so far; the turn that answers it shows the whole
    utterance and the held turns' lines go.
    """

    def __init__(self) -> None:
        self.turn_events: dict[int, list[Event]] = {}
        self.held: dict[int, list[str]] = {}  # reply text of turns still speculative
        self.lost_devices: dict[str, str] = {}  # kind ("input", "output") -> device name

    def lost_state(self) -> str:
        """The status bar's state while a device is lost ("" when none is)."""
        if len(self.lost_devices) > 1:
            return "audio lost"
        return {"input": "mic lost", "output": "speaker lost"}.get(next(iter(self.lost_devices), ""), "")

    def apply(self, event: Event, status: StatusBar, conversation: Conversation) -> bool:
        """Fold one event; True when the running turn's breakdown changed."""
        if isinstance(event, MicLevel):
            status.set(level_db=event.level_db)
            return False
        if isinstance(event, AudioDeviceLost):
            self.lost_devices[event.kind] = event.device
            conversation.notice(f"{device_notice(event)}; typing (t) still works", error=True)
            return False
        if isinstance(event, AudioDeviceRestored):
            self.lost_devices.pop(event.kind, None)
            conversation.notice(device_notice(event))
            return False
        if isinstance(event, EchoState):  # not a turn's: the mode, and why
            status.set(duplex=event.reason, duplex_mode="full duplex" if event.full_duplex else "half duplex")
            return False
        turn = event.turn_id
        if isinstance(event, SpeechOnset):
            return False  # maybe a cough: the turn shows once SpeechStarted says it is speech
        if isinstance(event, OVER_THE_REPLY):
            return self._over_the_reply(event, status, conversation)
        events = self.turn_events.setdefault(turn, [])
        events.append(event)
        if isinstance(event, SpeechStarted):
            conversation.hearing(turn)
            status.set(state="hearing")
        elif isinstance(event, PartialTranscript) and turn not in self.held:
            conversation.partial(turn, event.text)
        elif isinstance(event, SpeechPaused):
            status.set(state="pause")
        elif isinstance(event, SpeechResumed):
            status.set(state="hearing")
        elif isinstance(event, SpeculationStarted) and event.stage == "asr":
            self.held[turn] = []  # a speculative reply shows only once the turn is confirmed
        elif isinstance(event, SpeculationDiscarded):
            self.held.pop(turn, None)
            conversation.drop_reply(turn)
        elif isinstance(event, SpeechEnded | SpeculationConfirmed):
            status.set(state="thinking")
            if event.turn_id in self.held:
                for text in self.held.pop(turn):
                    conversation.token(turn, text)
        elif isinstance(event, TranscriptReady):
            for held in event.held_turns:
                conversation.drop_user(held)
            conversation.user(turn, event.text)
        elif isinstance(event, TurnHeld):  # no reply and no record: the speech goes on
            conversation.partial(turn, event.text or "(long speech: listening on)")
            self.turn_events.pop(turn, None)
            self.held.pop(turn, None)
            status.set(state="hearing")
            return False
        elif isinstance(event, TokenGenerated):
            if turn in self.held:
                self.held[turn].append(event.text)
            else:
                conversation.token(turn, event.text)
        elif isinstance(event, AudioReady) and event.index == 0:
            status.set(state="speaking")
        elif isinstance(event, TurnCancelled):
            conversation.flush()
            conversation.cancelled(turn, event.reason, event.heard_text)
            if event.reason == CancelReason.LLM_SERVER_LOST:
                conversation.notice(
                    "the LLM server stopped answering: the text so far is kept, the next turn connects again",
                    error=True,
                )
        return True

    def _over_the_reply(self, event: Event, status: StatusBar, conversation: Conversation) -> bool:
        """Speech over a reply, or its echo reading: part of the reply's turn while it runs."""
        if isinstance(event, BargeIn):
            conversation.notice(f"interrupted: reply stopped {(event.t_ns - event.onset_t_ns) / 1e6:.0f} ms")
        elif isinstance(event, ReplyPaused):
            status.set(state="hearing")  # the reply holds while the speech is judged
        elif isinstance(event, ReplyResumed):
            status.set(state="speaking")
        elif isinstance(event, OverlapHeard) and event.verdict is OverlapVerdict.STOP:
            # No turn: a lone "Stop." too short to be one leaves its number to the next speech.
            conversation.drop_hearing(event.overlap_turn)
            conversation.said(f"{event.text} [stop: not answered]")
        elif isinstance(event, OverlapHeard) and event.verdict in NOTHING_TO_ANSWER:
            conversation.drop_hearing(event.overlap_turn)  # its "(hearing…)" line
        events = self.turn_events.get(event.turn_id)
        if events is None:  # the reply's turn is over: its record has it
            return False
        events.append(event)
        return True


NOTHING_TO_ANSWER = (OverlapVerdict.NOISE, OverlapVerdict.BACKCHANNEL)
# Events of a reply's turn (``turn_id``) about speech over it; the speech itself is the next turn.
OVER_THE_REPLY = (BargeIn, ReplyPaused, OverlapHeard, ReplyResumed, EchoMeasured)

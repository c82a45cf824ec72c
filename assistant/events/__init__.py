"""Typed, timestamped pipeline events. Every event has ``turn_id`` and ``t_ns`` (monotonic_ns).

One module per part of a turn; import them from here.
"""

from assistant.events.base import CancelReason, DiscardReason, Event
from assistant.events.devices import AudioDeviceLost, AudioDeviceRestored, MicLevel
from assistant.events.duplex import (
    BargeIn,
    EchoMeasured,
    EchoState,
    OverlapHeard,
    OverlapVerdict,
    ReplyPaused,
    ReplyResumed,
)
from assistant.events.hearing import (
    OnsetEnded,
    PartialTranscript,
    SpeculationConfirmed,
    SpeculationDiscarded,
    SpeculationStarted,
    SpeechEnded,
    SpeechOnset,
    SpeechPaused,
    SpeechResumed,
    SpeechStarted,
    TranscriptReady,
    TurnDecision,
    TurnHeld,
)
from assistant.events.reply import (
    AudioReady,
    AudioStarted,
    PlaybackEnded,
    PromptSubmitted,
    SentenceReady,
    TokenGenerated,
    TurnCancelled,
    TurnDone,
)

__all__ = [
    "AudioDeviceLost",
    "AudioDeviceRestored",
    "AudioReady",
    "AudioStarted",
    "BargeIn",
    "CancelReason",
    "DiscardReason",
    "EchoMeasured",
    "EchoState",
    "Event",
    "MicLevel",
    "OnsetEnded",
    "OverlapHeard",
    "OverlapVerdict",
    "PartialTranscript",
    "PlaybackEnded",
    "PromptSubmitted",
    "ReplyPaused",
    "ReplyResumed",
    "SentenceReady",
    "SpeculationConfirmed",
    "SpeculationDiscarded",
    "SpeculationStarted",
    "SpeechEnded",
    "SpeechOnset",
    "SpeechPaused",
    "SpeechResumed",
    "SpeechStarted",
    "TokenGenerated",
    "TranscriptReady",
    "TurnCancelled",
    "TurnDecision",
    "TurnDone",
    "TurnHeld",
]

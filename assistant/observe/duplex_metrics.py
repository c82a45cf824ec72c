"""Prometheus metrics of full duplex: the echo canceller's mode and readings, speech over replies.

Part of :class:`assistant.observe.metrics.Metrics` (same registry, same event sink). The
mode follows :class:`~assistant.events.EchoState`; the counters follow the events of speech
over a reply; ERLE, the echo delay and the barge-in reaction come from the turn record
(``erle_db``, ``echo_delay_ms``, ``barge_in_ms``), so a scrape and the ``--log`` lines agree.
``docs/monitoring.md`` lists them.
"""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

from assistant.events import (
    CancelReason,
    EchoState,
    Event,
    OverlapHeard,
    OverlapVerdict,
    ReplyResumed,
    TurnCancelled,
)
from assistant.observe.latency import TurnRecord

# ERLE: ~0-6 dB is no cancellation to speak of, 15-25 dB a converged canceller on speakers,
# 30+ dB a quiet echo path (or a headset's).
ERLE_BUCKETS_DB = (0.0, 3.0, 6.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0)
# Echo delay: 20-150 ms on laptops and the test rig's loopback, more through Bluetooth.
DELAY_BUCKETS = (0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5)
# Barge-in reaction, judged against the 200 ms goal (issue [14]): fine around it.
REACTION_BUCKETS = (0.02, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.5, 1.0)


def verdict_label(verdict: OverlapVerdict) -> str:
    """An overlap's verdict as a label value: ``no words`` -> ``no_words``."""
    return re.sub(r"[^a-z0-9]+", "_", verdict.value).strip("_")


class DuplexMetrics:
    """The full-duplex series in ``registry``; call it with every event, :meth:`observe` per record."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.full_duplex = Gauge(
            "assistant_full_duplex",
            "1 while echo cancellation has converged and the microphone is heard during replies, else 0",
            registry=r,
        )
        self.mode = Info(
            "assistant_duplex", "Full or half duplex, and why (the status bar's words)", registry=r
        )
        self.erle = Histogram(
            "assistant_echo_erle_decibels",
            "Echo return loss enhancement over a reply (the echo canceller's reading)",
            buckets=ERLE_BUCKETS_DB,
            registry=r,
        )
        self.delay = Histogram(
            "assistant_echo_delay_seconds",
            "Echo delay (speaker to microphone) the canceller found over a reply",
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.reaction = Histogram(
            "assistant_barge_in_reaction_seconds",
            "Onset of the speech that interrupted a reply to the reply paused",
            buckets=REACTION_BUCKETS,
            registry=r,
        )
        self.overlaps = Counter(
            "assistant_overlaps",
            "Speech heard over a reply, by what it turned out to be",
            ["verdict"],
            registry=r,
        )
        self.false_barge_ins = Counter(
            "assistant_false_barge_ins",
            "Replies paused for speech that had no words for them (noise, backchannel) and resumed",
            registry=r,
        )
        self.continuations = Counter(
            "assistant_continuations",
            "Replies dropped because the user went on with the question (answered with the next turn)",
            registry=r,
        )
        for verdict in OverlapVerdict:  # zeros: rate() sees the first of each
            self.overlaps.labels(verdict_label(verdict))

    def __call__(self, event: Event) -> None:
        """Follow the mode and count the speech over replies."""
        if isinstance(event, EchoState):
            self.full_duplex.set(1 if event.full_duplex else 0)
            self.mode.info({"reason": event.reason})
        elif isinstance(event, OverlapHeard):
            self.overlaps.labels(verdict_label(event.verdict)).inc()
        elif isinstance(event, ReplyResumed):
            self.false_barge_ins.inc()
        elif isinstance(event, TurnCancelled) and event.reason == CancelReason.CONTINUED:
            self.continuations.inc()

    def observe(self, record: TurnRecord) -> None:
        """One reply's ERLE (dB), echo delay and barge-in reaction (ms in the record, seconds here)."""
        m = record.metrics
        if (erle_db := m.get("erle_db")) is not None:
            self.erle.observe(erle_db)
        if (delay_ms := m.get("echo_delay_ms")) is not None:
            self.delay.observe(delay_ms / 1000.0)
        if (reaction_ms := m.get("barge_in_ms")) is not None:
            self.reaction.observe(reaction_ms / 1000.0)

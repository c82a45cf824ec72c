"""The latency waterfall of the turn in progress and of the last finished turn."""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.console import Group, RenderableType
from rich.text import Text
from textual.widgets import Static

from assistant.observe.latency import TurnRecord

# The bar's pieces, in time order, between consecutive stamps of the turn: together they
# span speech end -> first audio, i.e. voice-to-voice. (start, stop, style, label format)
# The prompt step has no metric of its own, so no number (and often 0 cells); the rest of
# the first sentence reads "+N": it continues TTFT, and first sentence counts from the prompt.
# Work done speculatively inside the silence wait happened before the endpoint: each piece
# starts where the one before it ended, so such work shows only as the part still waited for.
# A turn that waited for the turns before it (a typed question, a reply that played on) shows
# that wait between the endpoint and ASR.
SEGMENTS = (
    ("speech_end", "endpoint", "on dark_cyan", "{:.0f}"),
    ("endpoint", "queued_until", "on grey37", "{:.0f}"),
    ("endpoint", "transcript", "on blue", "{:.0f}"),
    ("transcript", "prompt_submitted", "on grey30", ""),
    ("prompt_submitted", "first_token", "on dark_magenta", "{:.0f}"),
    ("first_token", "first_sentence", "on dark_orange3", "+{:.0f}"),
    ("first_sentence", "first_audio", "on green4", "{:.0f}"),
)
WAITING = ("on grey23", "...")  # the stage under way, while a turn runs
# The legend: the turn's metrics exactly as its JSON line has them (assistant.observe.latency).
# (label, short label, metric, style of its swatch)
LEGEND = (
    ("endpointing", "endpoint", "endpointing_ms", "on dark_cyan"),
    ("ASR", "ASR", "asr_ms", "on blue"),
    ("TTFT", "TTFT", "ttft_ms", "on dark_magenta"),
    ("first sentence", "1st sent", "first_sentence_ms", "on dark_orange3"),
    ("TTS first audio", "TTS", "tts_first_audio_ms", "on green4"),
)
# After endpointing, only in a turn that waited for the turns before it (``queued_ms``).
QUEUED = ("waited for the turn before", "wait", "on grey37")


def fmt_ms(value: float | None) -> str:
    """``412 ms``, or ``n/a`` for a stage the turn did not have."""
    return "n/a" if value is None else f"{value:.0f} ms"


def _detector(record: TurnRecord, narrow: bool) -> str:
    """What ended the turn: the model (``p0.93/62 ms``), or a rule and the model's last score.

    ``question p0.03``, ``max silence p0.11`` (the score says why the model did not end it),
    ``fixed silence``.
    """
    ms = record.metrics.get("turn_detection_ms")
    p = record.turn_probability
    if p is not None and ms is not None:
        if narrow:  # its ms are in the statistics table
            return f"p{p:.2f}"
        return f"p{p:.2f}/{ms:.0f} ms"
    rule = record.turn_detector.removesuffix("" if p is None else f" {p:.2f}")
    return rule if p is None else f"{rule} p{p:.2f}"


class LatencyBreakdown(Static):
    """Waterfall of the current and the last turn: speech end -> first audio, per stage.

    While a turn runs it redraws ten times a second with the time since the user stopped
    speaking (``clock`` is ``time.monotonic_ns``, replaceable for snapshots).
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.current: TurnRecord | None = None
        self.last: TurnRecord | None = None
        self.clock: Callable[[], int] = time.monotonic_ns
        self.narrow = False  # short labels: the long ones do not fit the width

    def on_mount(self) -> None:
        """Tick while a turn is in progress."""
        self.border_title = "latency: speech end -> first audio"
        self.set_interval(0.1, self._tick)

    def _tick(self) -> None:
        if self.current is not None:
            self.refresh()

    def show(self, record: TurnRecord, done: bool) -> None:
        """Update with ``record`` of the turn running (``done=False``) or just finished."""
        blocks = self._heights()
        if done:
            self.last, self.current = record, None
        else:
            self.current = record
        # A new layout only when a block appears, goes or gets its notes line; else a redraw.
        self.refresh(layout=blocks != self._heights())

    def _heights(self) -> tuple[int, int]:
        """Lines of the current and the last turn's blocks (0: none, 3, or 4 with notes)."""
        current, last = (0 if r is None else 3 + bool(r.duplex_notes()) for r in (self.current, self.last))
        return current, last

    def _bar(self, record: TurnRecord, width: int, running: bool) -> Text:
        ts = record.timestamps_ns
        spans: list[tuple[float, str, str]] = []
        end = 0  # where the last piece ended: later pieces start no earlier
        for a, b, style, fmt in SEGMENTS:
            if ts.get(a) and ts.get(b) and ts[b] >= ts[a]:
                start = max(ts[a], end)
                end = max(ts[b], start)
                spans.append(((end - start) / 1e6, style, fmt))
        if running and spans and not ts.get("first_audio"):  # the stage under way, growing
            spans.append((max(self.clock() - end, 0) / 1e6, *WAITING))
        total = sum(ms for ms, _, _ in spans)
        if total <= 0:
            return Text("(waiting for the first stage)", style="dim")
        bar = Text()
        used = 0
        complete = bool(ts.get("first_audio")) or running
        for i, (ms, style, fmt) in enumerate(spans):
            cells = round(width * ms / total)
            if fmt:
                cells = max(1, cells)  # every stage with a number is visible
            if complete and i == len(spans) - 1:
                cells = width - used  # rounding leftovers go to the last piece
            cells = max(0, min(cells, width - used))
            text = fmt.format(ms)
            bar.append(text.center(cells) if cells >= len(text) else " " * cells, style)
            used += cells
        return bar

    def _legend(self, record: TurnRecord) -> Text:
        m = record.metrics
        out = Text()
        for label, short, key, style in LEGEND:
            value = m.get(key)
            out.append("▮", style.removeprefix("on "))
            if self.narrow:  # one "ms" for the line
                out.append(f" {short} {'n/a' if value is None else f'{value:.0f}'}")
            else:
                out.append(f" {label} {fmt_ms(value)}")
            if key == "endpointing_ms" and record.turn_detector:
                out.append(f" ({_detector(record, self.narrow)})", "dim")
            if key == "endpointing_ms" and (queued := m.get("queued_ms")):
                name, brief, colour = QUEUED
                out.append(" ▮" if self.narrow else "  ▮", colour.removeprefix("on "))
                out.append(f" {brief} {queued:.0f}" if self.narrow else f" {name} {fmt_ms(queued)}")
            if key == "ttft_ms" and m.get("network_ms") is not None:  # a served decoder
                out.append(
                    f" (net {m['network_ms']:.0f})"
                    if self.narrow
                    else f" (network {fmt_ms(m['network_ms'])})",
                    "dim",
                )
            out.append(" " if self.narrow else "  ")
        if self.narrow:
            out.append("(ms)", "dim")
        out.rstrip()
        return out

    def _totals(self, title: str, record: TurnRecord) -> Text:
        m = record.metrics
        out = Text(f"{title}: turn {record.turn_id}  ", "bold")
        v2v = m.get("voice_to_voice_ms")
        name = "v2v" if self.narrow else "voice-to-voice"
        if v2v is None and title == "now":
            start = record.timestamps_ns.get("speech_end") or record.timestamps_ns.get("transcript")
            if start:
                out.append(f"{name} running {(self.clock() - start) / 1e9:.1f} s", "bold yellow")
        else:
            out.append(f"{name} {fmt_ms(v2v)}", "bold")
        tps = m.get("tokens_per_s")
        out.append(f"  {'n/a' if tps is None else f'{tps:.1f}'} tok/s")
        if not self.narrow:
            out.append(f"  {record.tokens} tok")
        out.append(f"  prompt {record.prompt_tokens} ({record.reused_tokens} reused)")
        if m.get("speculated_ms"):  # why the turn was fast: work done before the endpoint
            out.append(f"  overlap {m['speculated_ms']:.0f} ms", "italic")
        if record.cancelled:
            out.append(f"  ({record.cancelled})", "yellow")
        return out

    def _lines(self) -> list[Text]:
        width = max(self.size.width, 10)
        for self.narrow in (False, True):  # the long labels if they fit, else the short ones
            blocks: list[list[Text]] = []
            for title, record in (("now", self.current), ("last", self.last)):
                if record is not None:
                    bar = self._bar(record, width, running=title == "now")
                    blocks.append([self._totals(title, record), bar, self._legend(record)])
            if all(len(line.plain.rstrip()) <= width for block in blocks for line in block):
                break
        records = [r for r in (self.current, self.last) if r is not None]
        lines: list[Text] = []
        for block, record in zip(blocks, records, strict=True):
            lines += block
            if notes := record.duplex_notes():  # the reply was spoken over, or echo-cancelled
                lines.append(Text(f"over the reply: {'; '.join(notes)}", "italic"))
        return lines

    def render(self) -> RenderableType:
        """Three lines per turn: totals, the bar, the legend; a fourth if the reply was spoken over.

        The fourth says what happened over the reply (barge-in, overlaps, continued) and ERLE.
        """
        lines = self._lines()
        if not lines:
            return Text("latency breakdown: speak or press t to type", "dim")
        for line in lines:
            line.no_wrap = True
            line.overflow = "ellipsis"
        return Group(*lines)

    def plain(self) -> str:
        """The rendered text, without styles (what a user reads)."""
        return "\n".join(line.plain for line in self._lines())

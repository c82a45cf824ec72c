"""The UI's widgets: conversation, latency breakdown, session statistics, status bar."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import DataTable, Sparkline, Static

from assistant.latency import STAGES, TurnRecord, percentiles
from assistant.session import SessionInfo

# (label, record metric, start stamp, stop stamp, style) in waterfall order: the bar's
# segments follow the stamps, so they add up to voice-to-voice; the labels are the metrics.
SEGMENTS = (
    ("endpointing", "endpointing_ms", "speech_end", "endpoint", "on dark_cyan"),
    ("ASR", "asr_ms", "endpoint", "transcript", "on blue"),
    ("TTFT", "ttft_ms", "transcript", "first_token", "on dark_magenta"),
    ("first sentence", "first_sentence_ms", "first_token", "first_sentence", "on dark_orange3"),
    ("TTS first audio", "tts_first_audio_ms", "first_sentence", "first_audio", "on green4"),
)
STAGE_LABELS = {
    "endpointing_ms": "endpointing",
    "asr_ms": "ASR",
    "ttft_ms": "TTFT",
    "first_sentence_ms": "1st sentence",
    "tts_first_audio_ms": "TTS 1st audio",
    "voice_to_voice_ms": "voice-to-voice",
}


def fmt_ms(value: float | None) -> str:
    """``412 ms``, or ``n/a`` for a stage the turn did not have."""
    return "n/a" if value is None else f"{value:.0f} ms"


class Conversation(VerticalScroll, can_focus=False):
    """User utterances, streaming replies and system notices, newest at the bottom."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._user: dict[int, Static] = {}
        self._reply: dict[int, Static] = {}
        self._reply_text: dict[int, str] = {}

    def _add(self, widget: Static) -> Static:
        self.mount(widget)
        self.call_after_refresh(self.scroll_end, animate=False)  # after layout: deterministic
        return widget

    def notice(self, text: str, error: bool = False) -> None:
        """A system line (no microphone, loading, errors)."""
        self._add(Static(Text(text), classes="notice error" if error else "notice"))

    def hearing(self, turn: int) -> None:
        """Show that speech of ``turn`` is being heard (replaced by its transcript)."""
        if turn not in self._user:
            self._user[turn] = self._add(Static(Text("you: (hearing…)"), classes="user hearing"))

    def user(self, turn: int, text: str) -> None:
        """The final transcript (or typed text) of ``turn``."""
        widget = self._user.get(turn) or self._add(Static(classes="user"))
        self._user[turn] = widget
        widget.remove_class("hearing")
        widget.update(Text(f"you: {text or '(nothing recognised)'}"))

    def token(self, turn: int, text: str) -> None:
        """Append streamed reply text of ``turn``."""
        if turn not in self._reply:
            self._reply[turn] = self._add(Static(classes="assistant"))
            self._reply_text[turn] = ""
        self._reply_text[turn] += text
        self._reply[turn].update(Text(f"assistant: {self._reply_text[turn].strip()}"))
        self.call_after_refresh(self.scroll_end, animate=False)  # after layout: deterministic

    def reply_text(self, turn: int) -> str:
        """What has streamed of ``turn``'s reply."""
        return self._reply_text.get(turn, "").strip()

    def cancelled(self, turn: int, reason: str) -> None:
        """Mark ``turn`` as stopped early."""
        if turn in self._reply:
            self._reply[turn].update(Text(f"assistant: {self.reply_text(turn)} [{reason}]"))
        else:
            self.notice(f"turn {turn}: {reason}")


class LatencyBreakdown(Static):
    """Waterfall of the current and the last turn: speech end -> first audio, per stage."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.current: TurnRecord | None = None
        self.last: TurnRecord | None = None

    def show(self, record: TurnRecord, done: bool) -> None:
        """Update with ``record`` of the turn running (``done=False``) or just finished."""
        if done:
            self.last, self.current = record, None
        else:
            self.current = record
        self.refresh(layout=True)

    def _bar(self, record: TurnRecord, width: int) -> Text:
        ts = record.timestamps_ns
        spans = [
            (label, (ts[b] - ts[a]) / 1e6, style)
            for label, _, a, b, style in SEGMENTS
            if ts.get(a) and ts.get(b) and ts[b] >= ts[a]
        ]
        total = sum(ms for _, ms, _ in spans)
        bar = Text()
        if total <= 0:
            return Text("(waiting for the first stage)", style="dim")
        used = 0
        for i, (_label, ms, style) in enumerate(spans):
            cells = width - used if i == len(spans) - 1 and len(spans) == len(SEGMENTS) else 0
            cells = cells or max(1, round(width * ms / total))
            cells = min(cells, width - used)
            label = f"{ms:.0f}"
            bar.append(label.center(cells)[:cells] if cells >= len(label) else " " * cells, style)
            used += cells
        return bar

    def _legend(self, record: TurnRecord) -> Text:
        m = record.metrics
        out = Text()
        for label, key, *_, style in SEGMENTS:
            out.append("  ", style)
            out.append(f" {label} {fmt_ms(m.get(key))} ")
        return out

    @staticmethod
    def _totals(record: TurnRecord) -> Text:
        m = record.metrics
        tps = m.get("tokens_per_s")
        out = Text()
        out.append(f"voice-to-voice {fmt_ms(m.get('voice_to_voice_ms'))}", "bold")
        out.append(f"   {'n/a' if tps is None else f'{tps:.1f}'} tok/s   {record.tokens} tokens")
        out.append(f"   prompt {record.prompt_tokens} ({record.reused_tokens} reused)")
        return out

    def render(self) -> RenderableType:
        """Two blocks: the turn in progress (if any) and the last finished one."""
        width = max(self.size.width - 2, 10)
        blocks: list[RenderableType] = []
        for title, record in (("now", self.current), ("last", self.last)):
            if record is None:
                continue
            head = Text(f"{title}: turn {record.turn_id}  ", "bold")
            head.append_text(self._totals(record))
            if record.cancelled:
                head.append(f"  ({record.cancelled})", "yellow")
            blocks += [head, self._bar(record, width), self._legend(record)]
        if not blocks:
            blocks.append(Text("latency breakdown: speak or press t to type", "dim"))
        return Group(*blocks)

    def plain(self) -> str:
        """The rendered text, without styles (what a user reads)."""
        width = max(self.size.width - 2, 10)
        parts = []
        for record in (self.current, self.last):
            if record is not None:
                parts += [self._totals(record).plain, self._bar(record, width).plain]
                parts.append(self._legend(record).plain)
        return "\n".join(parts)


class SessionStats(Vertical):
    """P50/P95/P99/max per stage over the session, turn count, voice-to-voice sparkline."""

    def compose(self) -> ComposeResult:
        """Table, count and sparkline."""
        table: DataTable[str] = DataTable(show_cursor=False, zebra_stripes=True, id="stats-table")
        table.can_focus = False
        yield table
        yield Static("turns: 0", id="turn-count")
        yield Sparkline([], id="v2v-spark")

    def on_mount(self) -> None:
        """Columns and one row per stage."""
        table = self.query_one(DataTable)
        table.add_column("stage", key="stage")
        for col in ("P50", "P95", "P99", "max", "n"):
            table.add_column(col, key=col)
        for key in STAGES:
            table.add_row(STAGE_LABELS[key], "-", "-", "-", "-", "0", key=key)

    def update_records(self, records: Sequence[TurnRecord]) -> None:
        """Recompute from every finished turn of the session."""
        table = self.query_one(DataTable)
        stats = percentiles(records)
        for key in STAGES:
            s = stats.get(key)
            values = ["-"] * 4 + ["0"] if s is None else [f"{s[c]:.0f}" for c in ("p50", "p95", "p99", "max")]
            if s is not None:
                values.append(f"{s['n']:.0f}")
            for col, value in zip(("P50", "P95", "P99", "max", "n"), values, strict=True):
                table.update_cell(key, col, value, update_width=True)
        v2v = [r.metrics["voice_to_voice_ms"] or 0.0 for r in records if r.metrics.get("voice_to_voice_ms")]
        self.query_one("#turn-count", Static).update(
            f"turns: {len(records)}   voice-to-voice per turn (ms):" if v2v else f"turns: {len(records)}"
        )
        self.query_one(Sparkline).data = v2v


def level_meter(level_db: float | None, cells: int = 10) -> str:
    """``▮▮▮▮▯▯▯▯▯▯`` from -60 dBFS (empty) to 0 dBFS (full); blank without a microphone."""
    if level_db is None:
        return "-" * cells
    filled = round(cells * min(max((level_db + 60.0) / 60.0, 0.0), 1.0))
    return "▮" * filled + "▯" * (cells - filled)


class StatusBar(Static):
    """State, mic level, devices, models, backend, warm-up and GPU, on two lines."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.state = "loading"
        self.level_db: float | None = None
        self.info = SessionInfo()
        self.barge_in = False
        self.gpu = ""

    def set(self, **values: object) -> None:
        """Change any of ``state``, ``level_db``, ``info``, ``barge_in``, ``gpu``."""
        for key, value in values.items():
            setattr(self, key, value)
        self.refresh()

    def render(self) -> RenderableType:
        """The two status lines."""
        i = self.info
        warm = ", ".join(f"{k} {v:.0f} ms" for k, v in i.warm_up_ms.items()) or "-"
        line1 = Text()
        line1.append(f" {self.state.upper()} ", f"bold reverse {STATE_STYLES.get(self.state, '')}")
        line1.append(f" mic {level_meter(self.level_db if i.mic else None)} ")
        barge = "on" if self.barge_in else "off"
        line1.append(f" in: {i.mic or 'none'}  out: {i.speaker or 'none'}  barge-in {barge}")
        line2 = Text(
            f" LLM {i.llm or '-'} ({i.backend or '-'})  ASR {i.asr or 'none'}  warm-up {warm}"
            f"  GPU {self.gpu or 'none'}"
        )
        return Group(line1, line2)


STATE_STYLES = {
    "listening": "green",
    "hearing": "cyan",
    "thinking": "yellow",
    "speaking": "magenta",
    "muted": "red",
    "paused": "red",
    "loading": "blue",
    "text mode": "white",
}

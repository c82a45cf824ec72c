"""The session statistics pane: percentiles per stage and the voice-to-voice and GPU memory trends."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Sparkline, Static

from assistant.observe.gpu import GpuSample
from assistant.observe.latency import P999_MIN_SAMPLES, STAGES, TurnRecord, percentiles

STAGE_LABELS = {  # (label, short label when the long ones do not fit the pane)
    "endpointing_ms": ("endpointing", "endpoint"),
    "turn_detection_ms": ("turn detection", "turn det"),
    "asr_ms": ("ASR", "ASR"),
    "ttft_ms": ("TTFT", "TTFT"),
    "first_sentence_ms": ("1st sentence", "1st sent"),
    "tts_first_audio_ms": ("TTS 1st audio", "TTS"),
    "voice_to_voice_ms": ("voice-to-voice", "v2v"),
}
STAT_COLUMNS = (("P50", "p50"), ("P95", "p95"), ("P99", "p99"), ("P99.9", "p999"), ("max", "max"), ("n", "n"))
ROUGH = "~"  # marks a P99.9 over fewer than P999_MIN_SAMPLES turns
P999_NOTE = f"{ROUGH} rough: P99.9 needs n ≥ {P999_MIN_SAMPLES}"
V2V_LABEL, V2V_SHORT_LABEL = "voice-to-voice per turn:", "v2v per turn:"
GPU_HISTORY = 120  # GPU memory readings on the trend: 4 minutes at the UI's one per 2 s


def stat_cells(s: dict[str, float] | None) -> list[str]:
    """The numeric cells of one stage's row (ms, then the count); ``-`` for a stage no turn had."""
    if s is None:
        return ["-"] * (len(STAT_COLUMNS) - 1) + ["0"]
    rough = ROUGH if s["n"] < P999_MIN_SAMPLES else ""
    return [f"{rough if key == 'p999' else ''}{s[key]:.0f}" for _, key in STAT_COLUMNS]


class SessionStats(Vertical):
    """P50/P95/P99/P99.9/max per stage over the session, turn count, and the trends.

    The numbers are right-aligned with one space between columns (the pane is 46 columns
    wide at 80x24); the stage names are shortened when the long ones would not fit. Under
    the table, side by side: voice-to-voice per turn, and GPU memory once a GPU is read.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._cells = {key: stat_cells(None) for key in STAGES}
        self._short: bool | None = None  # the labels shown: None before the first fit
        self.gpu_memory_gib: deque[float] = deque(maxlen=GPU_HISTORY)

    def compose(self) -> ComposeResult:
        """Table, then the two trends (label and sparkline each)."""
        table: DataTable[str | Text] = DataTable(
            show_cursor=False, zebra_stripes=True, cell_padding=0, id="stats-table"
        )
        table.can_focus = False
        yield table
        with Horizontal(id="trends"):
            with Vertical(id="v2v-trend"):
                yield Static(V2V_LABEL, id="v2v-label", markup=False)
                yield Sparkline([], id="v2v-spark")
            with Vertical(id="gpu-trend"):
                yield Static("", id="gpu-label", markup=False)
                yield Sparkline([], id="gpu-spark")

    def on_mount(self) -> None:
        """Columns and one row per stage; no trend until there is something to plot."""
        self.border_title = "session: 0 turns"
        self.query_one("#v2v-trend").display = False
        self.query_one("#gpu-trend").display = False
        table = self.query_one(DataTable)
        table.add_column(" stage", key="stage")
        for col, _ in STAT_COLUMNS:
            table.add_column(Text(f" {col}", justify="right"), key=col)
        for key in STAGES:
            table.add_row(*self._row(key, short=False), key=key)
        self._fit()

    def on_resize(self) -> None:
        """Long or short stage names for the new width."""
        self._fit()

    def _row(self, key: str, short: bool) -> list[str | Text]:
        cells: list[str | Text] = [f" {STAGE_LABELS[key][short]}"]
        for (col, _), value in zip(STAT_COLUMNS, self._cells[key], strict=True):
            rough = col == "P99.9" and value.startswith(ROUGH)
            cells.append(Text(f" {value}", style="dim" if rough else "", justify="right"))
        return cells

    def _fit(self) -> None:
        """Stage names: the long ones when the table then fits the pane, else the short ones."""
        widths = [
            max(len(col), *(len(c[i]) for c in self._cells.values())) + 1
            for i, (col, _) in enumerate(STAT_COLUMNS)
        ]
        long_width = 1 + max(len(label) for label, _ in STAGE_LABELS.values()) + sum(widths)
        short = self.content_size.width > 0 and long_width > self.content_size.width
        if short == self._short:
            return
        self._short = short
        table = self.query_one(DataTable)
        for key in STAGES:
            table.update_cell(key, "stage", f" {STAGE_LABELS[key][short]}", update_width=True)

    def update_records(self, records: Sequence[TurnRecord]) -> None:
        """Recompute from every finished turn of the session."""
        table = self.query_one(DataTable)
        stats = percentiles(records)
        self._cells = {key: stat_cells(stats.get(key)) for key in STAGES}
        self._fit()  # wider numbers may need the short names
        for key in STAGES:
            for (col, _), cell in zip(STAT_COLUMNS, self._row(key, bool(self._short))[1:], strict=True):
                table.update_cell(key, col, cell, update_width=True)
        rough = any(s["n"] < P999_MIN_SAMPLES for s in stats.values())
        self.border_subtitle = P999_NOTE if rough else ""  # what the ~ means, while it is shown
        v2v = [r.metrics["voice_to_voice_ms"] or 0.0 for r in records if r.metrics.get("voice_to_voice_ms")]
        self.border_title = f"session: {len(records)} turn{'' if len(records) == 1 else 's'}"
        self.query_one("#v2v-trend").display = bool(v2v)  # typed turns only: nothing to plot
        self.query_one("#v2v-spark", Sparkline).data = v2v

    def add_gpu_sample(self, sample: GpuSample) -> None:
        """One more GPU reading on the memory trend (the last :data:`GPU_HISTORY` are plotted)."""
        self.gpu_memory_gib.append(sample.memory_used_bytes / 2**30)
        low, high = min(self.gpu_memory_gib), max(self.gpu_memory_gib)
        span = f"{high:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"
        self.query_one("#gpu-label", Static).update(f"GPU mem {span} GiB")  # the plot's scale
        self.query_one("#gpu-spark", Sparkline).data = list(self.gpu_memory_gib)
        self.query_one("#gpu-trend").display = True
        self.query_one("#v2v-label", Static).update(V2V_SHORT_LABEL)  # half the width now

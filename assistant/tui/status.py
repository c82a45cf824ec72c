"""The status bar: state, microphone level, devices, models, backend, engine, warm-up, GPU."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.text import Text
from textual.widgets import Static

from assistant.app import SessionInfo


def level_meter(level_db: float | None, cells: int = 10) -> str:
    """``▮▮▮▮▯▯▯▯▯▯`` from -60 dBFS (empty) to 0 dBFS (full); blank without a microphone."""
    if level_db is None:
        return "-" * cells
    filled = round(cells * min(max((level_db + 60.0) / 60.0, 0.0), 1.0))
    return "▮" * filled + "▯" * (cells - filled)


class StatusBar(Static):
    """State, mic level, devices, models, backend, engine cache, warm-up and GPU."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.state = "loading"
        self.level_db: float | None = None
        self.info = SessionInfo()
        self.barge_in = "auto"
        self.duplex = ""  # full or half duplex, and why (EchoState)
        self.duplex_mode = ""  # "full duplex" or "half duplex": shown alone when not even the cause fits
        self.gpu = ""

    def set(self, **values: object) -> None:
        """Change any of ``state``, ``level_db``, ``info``, ``barge_in``, ``duplex(_mode)``, ``gpu``."""
        for key, value in values.items():
            setattr(self, key, value)
        self.refresh(layout="info" in values or "gpu" in values)  # they may need a third line

    def render(self) -> RenderableType:
        """Two status lines, or three when the second does not fit the width."""
        i = self.info
        warm = ", ".join(f"{k} {v:.0f} ms" for k, v in i.warm_up_ms.items()) or "-"
        line1 = Text()
        line1.append(f" {self.state.upper()} ", f"bold reverse {STATE_STYLES.get(self.state, '')}")
        line1.append(f" mic {level_meter(self.level_db if i.mic else None)} ")
        line1.append(f" in: {i.mic or 'none'}  out: {i.speaker or 'none'}  barge-in {self.barge_in}")
        if self.duplex:  # the reason when it fits, else its cause alone, else the mode alone
            room = self.size.width - len(line1) - 2
            cause = self.duplex.split(" (")[0].split(";")[0]  # "half duplex: the echo path moved"
            line1.append(f"  {next((t for t in (self.duplex, cause) if len(t) <= room), self.duplex_mode)}")
        llm = f" LLM {i.llm or '-'} ({i.backend or '-'})  engine: {i.engine or '-'}"
        if i.turn:
            line1.append(f"  turn: {i.turn}")
        tts = f"  TTS {i.tts}" if i.tts else ""  # the voice speaking: "piper en_US-joe-medium"
        rest = f" ASR {i.asr or 'none'}{tts}  warm-up {warm}  GPU {self.gpu or 'none'}"
        lines = [line1, Text(f"{llm} {rest}")]
        if len(lines[1]) > self.size.width:
            lines = [line1, Text(llm), Text(rest)]
        for line in lines:
            line.no_wrap = True
            line.overflow = "ellipsis"
        return Group(*lines)


STATE_STYLES = {
    "listening": "green",
    "hearing": "cyan",
    "thinking": "yellow",
    "speaking": "magenta",
    "pause": "cyan",
    "muted": "red",
    "paused": "red",
    "loading": "blue",
    "text mode": "white",
    "mic lost": "red",
    "speaker lost": "red",
    "audio lost": "red",
}

"""The conversation pane: user utterances, streaming replies, system notices."""

from __future__ import annotations

from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

KEEP_ENTRIES = 80  # lines (utterances, replies, notices) kept: about the last 40 turns


class Conversation(VerticalScroll, can_focus=False):
    """User utterances, streaming replies and system notices, newest at the bottom.

    Only the newest :data:`KEEP_ENTRIES` entries stay: every entry is laid out again each
    time a streamed reply grows (20 times a second), which with 1,000 turns on screen took
    ~250 ms a time on the UI's thread, holding the GIL (``python -m bench.ui_growth``). The
    turn log (``--log``) and the export (``e``) keep every turn.
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._user: dict[int, Static] = {}
        self._reply: dict[int, Static] = {}
        self._reply_text: dict[int, str] = {}
        self._dirty: set[int] = set()

    def _add(self, widget: Static) -> Static:
        self.mount(widget)
        self._forget_oldest()
        self.call_after_refresh(self.scroll_end, animate=False)  # after layout: deterministic
        return widget

    def _forget_oldest(self) -> None:
        """Remove the entries past the newest :data:`KEEP_ENTRIES`, and what refers to them."""
        oldest = list(self.children)[: max(0, len(self.children) - KEEP_ENTRIES)]
        if not oldest:
            return
        gone = {id(widget) for widget in oldest}
        for turn in [turn for turn, widget in self._user.items() if id(widget) in gone]:
            del self._user[turn]
        for turn in [turn for turn, widget in self._reply.items() if id(widget) in gone]:
            del self._reply[turn]
            self._reply_text.pop(turn, None)
            self._dirty.discard(turn)
        self.remove_children(oldest)

    def notice(self, text: str, error: bool = False) -> None:
        """A system line (no microphone, loading, errors)."""
        self._add(Static(Text(text), classes="notice error" if error else "notice"))

    def hearing(self, turn: int) -> None:
        """Show that speech of ``turn`` is being heard (replaced by its transcript)."""
        if turn not in self._user:
            self._user[turn] = self._add(Static(Text("you: (hearing…)"), classes="user hearing"))

    def partial(self, turn: int, text: str) -> None:
        """Words of ``turn`` heard so far, while the user is still speaking."""
        self.hearing(turn)
        self._user[turn].update(Text(f"you: {text} …"))

    def drop_reply(self, turn: int) -> None:
        """Remove ``turn``'s reply (speculative work the user talked over)."""
        widget = self._reply.pop(turn, None)
        if widget is not None:
            widget.remove()
        self._reply_text.pop(turn, None)
        self._dirty.discard(turn)
        if turn in self._user:
            self._user[turn].add_class("hearing")

    def drop_user(self, turn: int) -> None:
        """Remove ``turn``'s user line (its words are shown with a later turn)."""
        widget = self._user.pop(turn, None)
        if widget is not None:
            widget.remove()

    def drop_hearing(self, turn: int) -> None:
        """Remove ``turn``'s "(hearing…)" line if no transcript replaced it (no words, "mm-hmm")."""
        widget = self._user.get(turn)
        if widget is not None and widget.has_class("hearing"):
            self.drop_user(turn)

    def said(self, text: str) -> None:
        """Words of the user that are no turn of their own (a stop request over a reply)."""
        self._add(Static(Text(f"you: {text}"), classes="user"))

    def user(self, turn: int, text: str) -> None:
        """The final transcript (or typed text) of ``turn``."""
        widget = self._user.get(turn) or self._add(Static(classes="user"))
        self._user[turn] = widget
        widget.remove_class("hearing")
        widget.update(Text(f"you: {text or '(nothing recognised)'}"))

    def token(self, turn: int, text: str) -> None:
        """Append streamed reply text of ``turn`` (shown at the next :meth:`flush`)."""
        if turn not in self._reply:
            self._reply[turn] = self._add(Static(classes="assistant"))
            self._reply_text[turn] = ""
        self._reply_text[turn] += text
        self._dirty.add(turn)

    def flush(self) -> None:
        """Show the reply text streamed since the last flush (one redraw per batch of tokens)."""
        for turn in self._dirty:
            self._reply[turn].update(Text(f"assistant: {self._reply_text[turn].strip()}"))
        if self._dirty:
            self.call_after_refresh(self.scroll_end, animate=False)  # after layout: deterministic
        self._dirty.clear()

    def reply_text(self, turn: int) -> str:
        """What has streamed of ``turn``'s reply."""
        return self._reply_text.get(turn, "").strip()

    def cancelled(self, turn: int, reason: str, heard: str = "") -> None:
        """Mark ``turn`` as stopped early.

        A reply cut while it played (``interrupted``, ``continued``) shows the words played
        (``heard``: what the history keeps) and the rest struck through.
        """
        if turn not in self._reply:
            self.notice(f"turn {turn}: {CANCEL_MARKS.get(reason, reason)}")
            return
        text = Text("assistant: ")
        words = " ".join(self.reply_text(turn).split())
        if reason in CUT and words.startswith(heard):
            text.append(heard)
            text.append(words[len(heard) :], "strike dim")
        else:
            text.append(self.reply_text(turn))
        text.append(f" [{CANCEL_MARKS.get(reason, reason)}]")
        self._reply[turn].update(text)


CUT = ("interrupted", "continued")  # replies stopped while they played: the unplayed rest is struck
CANCEL_MARKS = {
    "continued": "continued: you went on, answered with the next turn",
    "not heard": "not heard to its end: the microphone was muted, or closed as a reply began",
}

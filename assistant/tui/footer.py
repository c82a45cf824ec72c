"""The footer of key bindings."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.widgets import Footer


class KeyFooter(Footer):
    """The key bindings, wrapped onto more rows in a narrow window.

    ``Footer`` pins its grid to one row of columns; this one leaves the column count to
    app.tcss, which lays the keys out as a grid below 70 columns.
    """

    def compose(self) -> ComposeResult:
        """The keys; the grid's column count is left to the stylesheet."""
        yield from super().compose()
        self.styles.clear_rule("grid_size_columns")

    async def recompose(self) -> None:
        """The keys again (the bindings changed), and the old keys let go.

        Each key is bound to the footer's ``compact``, and Textual drops a removed key's
        watcher only when ``compact`` changes, which it never does here: every recompose (the
        text box taking the keys and giving them back: twice a typed turn) kept the 8 old keys
        alive, each with its styles and caches (~170 objects) for the garbage collector to
        walk. Marking ``compact`` changed drops the removed keys' watchers.
        """
        await super().recompose()
        self.mutate_reactive(Footer.compact)

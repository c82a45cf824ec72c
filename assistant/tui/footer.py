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

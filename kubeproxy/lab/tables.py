"""Tables for people: a table that turns into one block per row on a terminal too narrow for it.

Rich shrinks a wide table to the terminal by cutting cells (`10.96.30.30:…`, `KUBE-SVC-XQ…`),
which loses exactly what a reader came for. `FittingTable` prints the table when it fits at its
natural width, and otherwise each row as a heading (its first cell) with one `column  value`
line per other cell, so no address or chain name is ever cut (80 columns are enough).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

# Per column: a space either side and a border; plus the closing border.
_COLUMN_OVERHEAD, _TABLE_OVERHEAD = 3, 1


class FittingTable:
    def __init__(self, title: str, columns: Sequence[str]) -> None:
        self.title = title
        self.columns = list(columns)
        self.rows: list[list[str]] = []

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append(list(cells))

    def natural_width(self) -> int:
        """The width at which no cell needs wrapping or cutting (cells are markup, lines by \\n)."""
        widths = [max(_width(c) for c in [column, *(r[i] for r in self.rows)]) for i, column in enumerate(self.columns)]
        return sum(widths) + _COLUMN_OVERHEAD * len(widths) + _TABLE_OVERHEAD

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.natural_width() <= options.max_width:
            table = Table(title=self.title)
            for column in self.columns:
                table.add_column(column)
            for row in self.rows:
                table.add_row(*row)
            yield table
            return
        yield Text(self.title, style="italic")
        yield from self._stacked()

    def _stacked(self) -> Iterator[Table | Text]:
        label = max(len(c) for c in self.columns[1:]) if len(self.columns) > 1 else 0
        for row in self.rows:
            yield Text.from_markup(row[0], style="bold")
            grid = Table.grid(padding=(0, 2), pad_edge=True)
            grid.add_column(min_width=label + 2, style="dim", no_wrap=True)
            grid.add_column(overflow="fold")
            for column, cell in zip(self.columns[1:], row[1:], strict=True):
                grid.add_row("  " + column, Text.from_markup(cell))
            yield grid


def _width(cell: str) -> int:
    return max((Text.from_markup(line).cell_len for line in cell.split("\n")), default=0)

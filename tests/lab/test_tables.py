"""FittingTable: a table where it fits, one block per row where it does not; nothing cut either way."""

from __future__ import annotations

from rich.console import Console

from kubeproxy.lab.tables import FittingTable

ROWS = [
    ("default/session", "10.96.30.30:9000/TCP", "10.244.1.30:9000*\n10.244.2.30:9000", "KUBE-SVC-XQATF6GKVNVCZZMN"),
    ("dns/bind:dns-udp", "10.96.0.53:53/UDP\next 192.168.0.53", "[red]none[/]", "KUBE-SVC-ABDQF22VDUULVYME"),
]


def _printed(width: int) -> str:
    table = FittingTable("services", ("service port", "addresses", "endpoints", "entry chain"))
    for row in ROWS:
        table.add_row(*row)
    console = Console(width=width, record=True, color_system=None)
    console.print(table)
    return console.export_text()


def test_narrow_terminals_get_blocks_without_cut_cells() -> None:
    text = _printed(80)
    assert "…" not in text and "┃" not in text
    for cell in ("10.96.30.30:9000/TCP", "10.244.2.30:9000", "KUBE-SVC-XQATF6GKVNVCZZMN", "ext 192.168.0.53", "none"):
        assert cell in text
    assert all(len(line) <= 80 for line in text.splitlines())


def test_wide_terminals_get_the_table() -> None:
    text = _printed(160)
    assert "┃ service port" in text and "KUBE-SVC-ABDQF22VDUULVYME" in text and "…" not in text

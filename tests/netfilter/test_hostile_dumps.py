"""Any byte sequence given to the offline tools (`trace`, `doctor`, `graph`) ends in a clear error
naming the file (and the line where there is one), never a traceback."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kubeproxy.cli import main
from kubeproxy.netfilter import nft_json
from kubeproxy.netfilter.dumpfile import DumpError, read_dump
from kubeproxy.netfilter.ruleset import ParseError

TRACE = ["trace", "--proto", "tcp", "--src", "10.0.0.9:1000", "--dst", "10.96.0.1:80", "--in-iface", "eth0",
         "--iface", "eth0=10.0.0.1/24", "--rules"]  # fmt: skip
COMMANDS = {"trace": TRACE, "doctor": ["doctor", "--rules"], "graph": ["graph", "--rules"]}


def run(command: str, path: Path, *extra: str) -> Result:
    return CliRunner().invoke(main, [*COMMANDS[command], str(path), *extra])


def refused(result: Result) -> str:
    """The error text of a run that must end with a clear error, not a traceback."""
    text = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert result.exit_code == 2, text
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text
    return text


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_json_nested_fifty_thousand_deep(tmp_path: Path, command: str) -> None:
    dump = tmp_path / "deep.json"
    dump.write_text('{"nftables": [' + "[" * 50_000 + "]" * 50_000 + "]}")
    text = refused(run(command, dump))
    assert str(dump) in text and "nested too deeply" in text


def test_nesting_within_the_decoders_bound_but_past_the_walks_stack_is_refused() -> None:
    inner = '{"meta": {"key": "mark"}}'
    for _ in range(900):
        inner = '{"concat": [' + inner + ", 1]}"
    rule = '{"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"match": {"op": "==", "left": ' + inner
    text = '{"nftables": [{"table": {"family": "ip", "name": "t"}}, ' + rule + ', "right": 1}}]}}]}'
    with pytest.raises(ParseError, match="nested too deeply"):
        nft_json.parse(text)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_dump_that_is_not_utf8_names_the_file_line_and_column(tmp_path: Path, command: str) -> None:
    dump = tmp_path / "latin1.rules"
    dump.write_bytes(b"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"caf\xe9\" -j ACCEPT\nCOMMIT\n")
    text = refused(run(command, dump))
    assert f"{dump}: line 3, column 35: not UTF-8 text (byte 0xe9" in text


@pytest.mark.parametrize("flag", ["--ipvs", "--ipset-file"])
def test_the_other_dumps_of_trace_are_read_the_same_way(tmp_path: Path, flag: str) -> None:
    rules = tmp_path / "rules"
    rules.write_text("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n")
    other = tmp_path / "other"
    other.write_bytes(b"-A 10.96.0.1:80\n\xff\n")
    text = refused(run("trace", rules, flag, str(other)))
    assert f"{flag} {other}: line 2, column 1: not UTF-8 text (byte 0xff" in text


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_random_bytes_never_give_a_traceback(tmp_path: Path, command: str) -> None:
    rnd = random.Random(25)
    starts = [b"", b"*nat\n", b'{"nftables": [', b"table ip t {\n", b"Chain INPUT (policy ACCEPT)\n", b"\xef\xbb\xbf"]
    for case in range(40):
        dump = tmp_path / f"case{case}"
        body = bytes(rnd.getrandbits(8) for _ in range(rnd.randint(0, 300)))
        if case % 2:  # mostly text: reaches the parsers, not only the decoder
            body = bytes(b % 95 + 32 if b % 7 else 10 for b in body)
        dump.write_bytes(rnd.choice(starts) + body)
        result = run(command, dump)
        text = result.output + (result.stderr if result.stderr_bytes is not None else "")
        assert result.exception is None or isinstance(result.exception, SystemExit), (case, repr(result.exception))
        assert "Traceback" not in text
        if result.exit_code:
            assert str(dump) in text or "no kube-proxy rules" in text, (case, text)


def test_read_dump_bounds_and_names(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match=f"{tmp_path / 'missing'}: No such file or directory"):
        read_dump(str(tmp_path / "missing"))
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with pytest.raises(DumpError, match="bigger than 100 bytes"):
        read_dump(str(big), max_bytes=100)
    assert read_dump(str(big), max_bytes=101) == "x" * 101


def test_a_fifo_reads_like_a_file(tmp_path: Path) -> None:
    fifo = tmp_path / "dump"
    os.mkfifo(fifo)
    writer = threading.Thread(target=fifo.write_text, args=("*nat\nCOMMIT\n",))
    writer.start()
    try:
        assert read_dump(str(fifo)) == "*nat\nCOMMIT\n"  # `kubeproxy trace --rules <(iptables-save)`
    finally:
        writer.join(timeout=30)

"""`kubeproxy dns check`: the seed's 100-query health check, through the click group."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kubeproxy.lab.dns.check import run_check
from kubeproxy.lab.dns.command_group import dns
from kubeproxy.lab.dns.dns_message import Zone, answer, make_query
from kubeproxy.lab.dns.responder import Responder


def _run(*args: str) -> Result:
    return CliRunner().invoke(dns, list(args), catch_exceptions=False)


def _server(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


def test_healthy_server_every_query_from_its_own_port() -> None:
    with Responder(record_sources=True) as r:
        out = _run("check", "--server", _server(r.address), "--name", "www.lab.test")
        seen = r.sources
    assert out.exit_code == 0, out.output
    assert "answered    100/100 within 1s" in out.output
    assert "rcodes      NOERROR=100" in out.output
    assert out.output.rstrip().endswith("healthy")
    assert "latency ms  p50 " in out.output and " p99 " in out.output and " max " in out.output
    assert len(seen) == 100
    assert len({port for _, port in seen}) == 100  # 100 distinct source ports, as the responder saw them


def test_outcomes_name_the_ports_the_server_saw() -> None:
    with Responder(record_sources=True) as r:
        result = run_check(r.address, make_query("x.lab.test"), queries=20)
        seen = {port for _, port in r.sources}
    assert result.healthy and result.answered == 20
    assert {o.source_port for o in result.outcomes} == seen


def test_one_in_fifty_dropped_is_unhealthy() -> None:
    with Responder(drop_every=50) as r:
        out = _run("check", "--server", _server(r.address), "--timeout", "300ms")
        dropped = r.dropped
    assert dropped == 2
    assert out.exit_code == 1, out.output
    assert "answered    98/100 within 300ms (timeout 2)" in out.output
    assert "unhealthy: 2 of 100 queries not answered within 300ms" in out.output


def _closed_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_closed_port_is_unhealthy() -> None:
    out = _run("check", "--server", f"127.0.0.1:{_closed_udp_port()}", "--timeout", "500ms")
    assert out.exit_code == 1, out.output
    assert "answered    0/100" in out.output
    assert "refused 100" in out.output  # ICMP port unreachable, reported on the connected sockets
    assert "latency ms  -" in out.output


@contextmanager
def _scripted(reply: Callable[[bytes], list[bytes]], *, expect: int, hold: threading.Event | None = None) -> Iterator[str]:
    """A responder that reads `expect` queries, optionally waits for `hold`, then sends reply(query) for each."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(10)

    def serve() -> None:
        got = [sock.recvfrom(4096) for _ in range(expect)]
        if hold is not None:
            hold.wait(10)
        for data, peer in got:
            for out in reply(data):
                sock.sendto(out, peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield _server(sock.getsockname())
    finally:
        thread.join(15)
        sock.close()


def test_answers_with_another_id_or_question_do_not_count() -> None:
    def wrong(query: bytes) -> list[bytes]:
        good = answer(query, Zone())
        assert good is not None
        other_id = bytes([good[0] ^ 0xFF]) + good[1:]
        other_q = answer(query[:2] + make_query("zzz.lab.test").tail, Zone())
        assert other_q is not None
        return [other_id, other_q]

    with _scripted(wrong, expect=10) as server:
        out = _run("check", "--server", server, "--queries", "10", "--timeout", "300ms")
    assert out.exit_code == 1, out.output
    assert "answered    0/10" in out.output and "timeout 10" in out.output
    assert "mismatched  20 datagrams" in out.output


def test_a_stray_datagram_before_the_answer_is_skipped() -> None:
    def stray_then_good(query: bytes) -> list[bytes]:
        good = answer(query, Zone())
        assert good is not None
        return [b"\x00garbage", good]

    with _scripted(stray_then_good, expect=10) as server:
        out = _run("check", "--server", server, "--queries", "10")
    assert out.exit_code == 0, out.output
    assert "answered    10/10" in out.output and "mismatched  10 datagrams" in out.output


def test_linger_tells_late_answers_from_lost_ones() -> None:
    # The server holds every answer until the check's wait is over: the seed's epilogue case
    # (an RWT shorter than the server's answer time fails a server that does answer).
    release = threading.Event()

    def good(query: bytes) -> list[bytes]:
        resp = answer(query, Zone())
        return [resp] if resp else []

    with _scripted(good, expect=10, hold=release) as server:
        timer = threading.Timer(0.3, release.set)
        timer.start()
        out = _run("check", "--server", server, "--queries", "10", "--timeout", "100ms", "--linger", "5s")
        timer.join()
    assert out.exit_code == 1, out.output
    assert "answered    0/10 within 100ms (answered late 10)" in out.output
    assert "late ms     p50 " in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server", "dns.example"], "'dns.example' is not an IP address"),
        (["--server", "127.0.0.1:70000"], "port '70000' is not in 1-65535"),
        (["--server", "127.0.0.1", "--timeout", "1"], "'1' is not a duration like 1s"),
        (["--server", "127.0.0.1", "--timeout", "0s"], "must be longer than 0s"),
        (["--server", "127.0.0.1", "--type", "BOGUS"], "unknown record type 'BOGUS'"),
        (["--server", "127.0.0.1", "--name", "a..b"], "empty label"),
        (["--server", "127.0.0.1", "--queries", "0"], "--queries"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_error(args: list[str], message: str) -> None:
    out = _run("check", *args)
    assert out.exit_code == 2, out.output
    assert message in out.output
    assert "Traceback" not in out.output


def test_ipv6_server() -> None:
    with Responder("::1") as r:
        out = _run("check", "--server", f"[::1]:{r.address[1]}", "--queries", "20")
    assert out.exit_code == 0, out.output
    assert "dns check [::1]:" in out.output and "answered    20/20" in out.output


def test_without_server_or_nameserver_the_error_says_what_to_give(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeproxy.lab.dns import command_group

    monkeypatch.setattr(command_group, "RESOLV_CONF", tmp_path / "resolv.conf")  # none: no query is sent anywhere
    out = _run("check")
    assert out.exit_code == 2 and "no nameserver in" in out.output + (out.stderr or "")

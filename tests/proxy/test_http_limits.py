"""The health and metrics servers under attack (item 9), over real sockets on 127.0.0.1:
idle connections beyond the bound are closed (oldest first) and fresh requests still answered,
one budget bounds all servers together, silent clients are dropped after the head timeout,
busy servers stop accepting, and accept failing with EMFILE is logged once with a count."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import pytest

from kubeproxy.model.metrics import ProxyMetrics
from kubeproxy.proxy.health import ProxyHealth, ServiceHealthServers, serve_healthz
from kubeproxy.proxy.http import ConnectionBudget, ErrorLog, Limits, Response, serve
from tests.paths import REPO as ROOT
from tests.proxy.servers import port_of


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))



def _ok(method: str, path: str, headers: object) -> Response:
    return Response(200, {"Content-Type": "text/plain"}, b"ok")


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def idle(port: int) -> Conn:
    """A connection that sends nothing."""
    return await asyncio.open_connection("127.0.0.1", port)


async def closed_by_server(conn: Conn, timeout: float = 10) -> str:
    """Until the server closes `conn`: "reset" (closed as idle to make room) or "eof" (timed out)."""
    reader, writer = conn
    try:
        data = await asyncio.wait_for(reader.read(), timeout)
    except ConnectionResetError:
        return "reset"
    finally:
        writer.close()
    assert data == b"", data
    return "eof"


async def unread(port: int, client_port: int) -> int:
    """Bytes the kernel holds, not yet read, on the server's side of a connection to `port`."""
    ss = await asyncio.to_thread(
        subprocess.run, ["ss", "-Htn", f"sport = :{port} and dport = :{client_port}"],
        capture_output=True, text=True, check=True,
    )
    return int(ss.stdout.split()[1]) if ss.stdout.strip() else 0  # ESTAB <Recv-Q> <Send-Q> ...


async def request(port: int, path: str = "/") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


def test_idle_connections_beyond_the_bound_are_closed_oldest_first_and_requests_still_answered() -> None:
    async def main() -> None:
        server = await serve("127.0.0.1:0", _ok, limits=Limits(max_connections=4), budget=ConnectionBudget(100))
        port = port_of(server)
        try:
            conns = [await idle(port) for _ in range(10)]
            # The six oldest are closed as the newer ones come in (a reset: nothing is owed to them).
            assert [await closed_by_server(c) for c in conns[:6]] == ["reset"] * 6
            assert server.active == 4 and server.budget.active == 4
            # A probe is answered at once, though four idle clients fill the server: the oldest of
            # them makes room.
            assert (await request(port)).startswith(b"HTTP/1.1 200 ")
            assert await closed_by_server(conns[6]) == "reset"
            assert server.active == 3
            # Three idle ones never got anything and are still held open.
            for reader, _ in conns[7:]:
                assert not reader.at_eof()
        finally:
            server.close()
            for _, writer in conns:
                writer.close()

    run(main)


def test_one_budget_bounds_all_servers_together() -> None:
    async def main() -> None:
        budget = ConnectionBudget(4)
        a = await serve("127.0.0.1:0", _ok, name="a", budget=budget)
        b = await serve("127.0.0.1:0", _ok, name="b", budget=budget)
        try:
            conns = [await idle(port_of(a)) for _ in range(4)]
            # Wait until the server holds all four: the budget is full of a's idle connections.
            while budget.active < 4:
                await budget._wait(5)
            assert (await request(port_of(b))).startswith(b"HTTP/1.1 200 ")  # b still answers
            assert await closed_by_server(conns[0]) == "reset"  # by closing a's oldest idle one
            assert a.active == 3 and b.active == 0 and budget.active == 3
        finally:
            a.close()
            b.close()

    run(main)


def test_silent_clients_are_dropped_after_the_head_timeout() -> None:
    async def main() -> None:
        server = await serve("127.0.0.1:0", _ok, limits=Limits(head_timeout=0.3))
        port = port_of(server)
        try:
            started = time.monotonic()
            conns = [await idle(port) for _ in range(3)]
            # A slowloris client: part of a head, then nothing more.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.1\r\nX-Slow: ")
            conns.append((reader, writer))
            assert [await closed_by_server(c) for c in conns] == ["eof"] * 4
            assert time.monotonic() - started >= 0.3  # not before the timeout
            while server.active:
                await server.budget._wait(5)
        finally:
            server.close()

    run(main)


def test_a_client_that_does_not_read_the_answer_is_dropped_after_the_write_timeout() -> None:
    big = b"x" * (16 << 20)  # far more than the socket buffers hold

    def handler(method: str, path: str, headers: object) -> Response:
        return Response(200, {}, big)

    async def main() -> None:
        server = await serve("127.0.0.1:0", handler, limits=Limits(write_timeout=0.3))
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
            writer.write(b"GET / HTTP/1.1\r\n\r\n")

            async def dropped() -> None:
                while server.active:  # the server gives up on us although we never read
                    await server.budget._wait(10)

            await asyncio.wait_for(dropped(), 30)  # a bound, so a server that never drops it fails here
            assert not server.active
            writer.close()
        finally:
            server.close()

    run(main)


def test_a_server_whose_slots_are_all_busy_stops_accepting_until_one_frees() -> None:
    release = asyncio.Event()
    inside = 0
    most = 0
    entered = asyncio.Condition()

    async def slow(method: str, path: str, headers: object) -> Response:
        nonlocal inside, most
        inside += 1
        most = max(most, inside)
        async with entered:
            entered.notify_all()
        await release.wait()
        inside -= 1
        return Response(200)

    async def main() -> None:
        server = await serve("127.0.0.1:0", slow, limits=Limits(max_connections=2), budget=ConnectionBudget(100))
        port = port_of(server)
        try:
            first = [asyncio.create_task(request(port)) for _ in range(2)]
            async with entered:
                await entered.wait_for(lambda: inside == 2)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
            writer.write(head)
            client_port = writer.get_extra_info("sockname")[1]
            # The third's request has reached the server's side of the connection (in the kernel's
            # accept queue, or accepted and held until a slot frees); a server serving it instead
            # reads it and lets it in, and the wait ends either way.
            while inside < 3 and await unread(port, client_port) < len(head):
                await asyncio.sleep(0.01)
            # The request is readable: a connection the loop watched would be read within a turn
            # of the loop. Turns, not time: after them it must still be unread and not inside.
            for _ in range(20):
                await asyncio.sleep(0)
            assert (inside, server.active, await unread(port, client_port)) == (2, 2, len(head))
            release.set()
            answers = [*await asyncio.gather(*first), await asyncio.wait_for(reader.read(), 10)]
            writer.close()
            assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers), answers
            assert most == 2
        finally:
            server.close()

    run(main)


def test_error_log_logs_once_then_counts(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    errors = ErrorLog(logging.getLogger("test.errorlog"), interval=5, clock=lambda: now[0])
    with caplog.at_level(logging.ERROR, logger="test.errorlog"):
        for _ in range(1000):
            errors.report("emfile", "accept failed: Too many open files")
        assert [r.getMessage() for r in caplog.records] == ["accept failed: Too many open files"]
        assert errors.pending("emfile") == 999
        now[0] = 6.0
        errors.report("emfile", "accept failed: Too many open files")
        assert caplog.records[-1].getMessage() == "accept failed: Too many open files (repeated 1000 times in 6.0s)"
        errors.report("other", "something else")
        assert len(caplog.records) == 3


def test_error_log_flushes_the_count_of_a_burst_that_stopped(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        errors = ErrorLog(logging.getLogger("test.errorlog"), interval=0.1)
        for _ in range(50):
            errors.report("k", "boom")
        while errors.pending("k"):
            await asyncio.sleep(0.05)  # waiting for the interval's timer to run is the point here
        assert [r.getMessage() for r in caplog.records if r.name == "test.errorlog"][-1].startswith("boom (repeated 49 times in ")

    with caplog.at_level(logging.ERROR, logger="test.errorlog"):
        run(main)


def test_budget_keeps_a_reserve_of_descriptors() -> None:
    assert ConnectionBudget.from_rlimit(1024).limit == 512
    assert ConnectionBudget.from_rlimit(200).limit == 72  # at least 128 kept
    assert ConnectionBudget.from_rlimit(64).limit == 4  # tiny limit: a few slots still
    assert ConnectionBudget.from_rlimit(1 << 20).limit == 4096


# The server in a process of its own whose open-file limit is just above what it has open.
EMFILE_SERVER = """
import asyncio, logging, os, resource, sys
from kubeproxy.proxy.http import ConnectionBudget, ErrorLog, Limits, Response, serve

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")

async def main():
    server = await serve(
        "127.0.0.1:0",
        lambda *_: Response(200, {}, b"ok"),
        limits=Limits(max_connections=1000, accept_retry=0.05),
        budget=ConnectionBudget(1000),  # larger than the descriptors: accept hits EMFILE first
        errors=ErrorLog(interval=0.5),
    )
    spare = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + spare, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""  # noqa: E501


def test_emfile_on_accept_is_logged_once_with_a_count_and_the_server_recovers() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", EMFILE_SERVER, "6"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        port = int(proc.stdout.readline())

        async def main() -> list[bytes]:
            # Far more idle connections than the server has descriptors for: the kernel completes
            # them all (backlog), the server's accept fails with EMFILE.
            conns = [await idle(port) for _ in range(40)]
            answers = [await request(port) for _ in range(3)]  # still answered, by closing idle ones
            for _, writer in conns:
                writer.close()
            return answers

        answers = asyncio.run(asyncio.wait_for(main(), 30))
        assert all(a.startswith(b"HTTP/1.1 200 ") for a in answers), answers
        lines: list[str] = []
        # The count comes at the end of the interval: read until it does (or the process dies).
        for line in proc.stderr:
            lines.append(line.rstrip())
            if "repeated" in line:
                break
    finally:
        proc.kill()
        proc.wait()
    failures = [x for x in lines if "Failed to accept" in x]
    assert failures, lines
    assert "Too many open files" in failures[0] and "repeated" not in failures[0]
    assert len([x for x in failures if "repeated" not in x]) == 1, lines  # logged once...
    assert "repeated" in failures[-1]  # ...then as a count
    assert not any("Traceback" in x for x in lines), lines


def test_health_check_ports_and_healthz_share_one_budget() -> None:
    """An attacker holding idle connections to a health-check node port cannot starve /healthz
    (or the other way round): the proxy's servers draw from one budget, and the oldest idle
    connection anywhere makes room."""

    async def main() -> None:
        health = ProxyHealth(10.0)
        hc = ServiceHealthServers(health, ("127.0.0.1",), budget=ConnectionBudget(8))
        healthz = await serve_healthz(health, ProxyMetrics(), "127.0.0.1:0", budget=hc.budget, errors=hc.errors)
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            await hc.sync_services({("default", "web"): port})
            conns = [await idle(port) for _ in range(20)]
            assert [await closed_by_server(c) for c in conns[:12]] == ["reset"] * 12
            assert hc.budget.active == 8
            assert (await request(port_of(healthz), "/healthz")).startswith(b"HTTP/1.1 200 ")
            assert await closed_by_server(conns[12]) == "reset"
            assert (await request(port, "/")).startswith(b"HTTP/1.1 503 ")  # no local endpoints: 503, answered
        finally:
            healthz.close()
            await hc.close()

    run(main)

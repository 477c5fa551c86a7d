"""The seed's DNS health check: N queries, healthy only if every one is answered within the wait.

The BIND report's checker "throws 100 queries and counts how many are answered"; its one setting is the
response wait time (RWT) for all 100. So the queries go out together, as one burst, and the
check then waits. Each query has its own UDP socket, created for it and closed afterwards, so
each comes from its own source port: through a node that masquerades, each one is a new
conntrack entry that needs its own SNAT port, the resource the seed found exhausted. All the
sockets are open at once, so the kernel cannot hand out a port twice within one check.

A query counts as answered when a datagram with its ID and its question arrives on its socket
within `timeout` of its own send (they all leave within milliseconds, so this is the seed's one
RWT). `linger` keeps listening past the wait, to tell "slow" (answered late, the seed's epilogue
asks whether a 1 s RWT fails a server that answers in 1.1 s) from "lost".
"""

from __future__ import annotations

import _socket
import random
import select
import time
from collections import Counter
from dataclasses import dataclass

from kubeproxy.lab.dns.dns_message import Query, rcode_name, response_rcode
from kubeproxy.lab.dns.endpoints import family_of, format_hostport
from kubeproxy.lab.dns.limits import ensure_open_files
from kubeproxy.lab.dns.sockets import errno_name, query_socket, recv_stamped
from kubeproxy.lab.dns.stats import Summary, format_duration


@dataclass(frozen=True)
class Outcome:
    """What happened to one query of a check."""

    source_port: int
    latency: float | None = None  # seconds, answered within the wait
    late: float | None = None  # seconds, answered after the wait but within the linger
    failure: str | None = None  # "timeout", "refused", or the errno name of a send error
    rcode: int | None = None

    @property
    def answered(self) -> bool:
        return self.latency is not None


@dataclass(frozen=True)
class CheckResult:
    server: tuple[str, int]
    query: Query
    timeout: float
    outcomes: tuple[Outcome, ...]
    mismatched: int  # datagrams that arrived on a query's socket but did not answer it

    @property
    def answered(self) -> int:
        return sum(o.answered for o in self.outcomes)

    @property
    def healthy(self) -> bool:
        return self.answered == len(self.outcomes)

    @property
    def latency(self) -> Summary | None:
        return Summary.of(o.latency for o in self.outcomes if o.latency is not None)

    def failures(self) -> Counter[str]:
        counts: Counter[str] = Counter(o.failure for o in self.outcomes if o.failure)
        late = sum(o.late is not None for o in self.outcomes)
        if late:
            counts["answered late"] = late
        return counts

    def rcodes(self) -> Counter[str]:
        return Counter(rcode_name(o.rcode) for o in self.outcomes if o.rcode is not None and o.latency is not None)


def run_check(
    server: tuple[str, int],
    query: Query,
    *,
    queries: int = 100,
    timeout: float = 1.0,
    linger: float = 0.0,
    rng: random.Random | None = None,
) -> CheckResult:
    """Send `queries` queries at once, each from a fresh socket, and wait for the answers."""
    ids = [(rng or random.Random()).getrandbits(16) for _ in range(queries)]
    family = family_of(server[0])
    ensure_open_files(queries + 64)
    socks: dict[int, _socket.socket] = {}  # query index -> its socket
    ports = [0] * queries
    sent_at = [0.0] * queries  # wall clock, the kernel's receive stamps are in the same clock
    result: list[Outcome | None] = [None] * queries
    mismatched = 0
    epoll = select.epoll()
    by_fd: dict[int, int] = {}
    try:
        for i in range(queries):
            try:
                sock = socks[i] = query_socket(family)
                # connect() binds the fresh ephemeral port and lets ICMP port-unreachable surface as "refused".
                sock.connect(server)
                ports[i] = sock.getsockname()[1]
                sent_at[i] = time.time()
                sock.send(query.packet(ids[i]))
            except OSError as exc:
                result[i] = Outcome(ports[i], failure=errno_name(exc))
                continue
            epoll.register(sock.fileno(), select.EPOLLIN)
            by_fd[sock.fileno()] = i
        # All were sent within a few milliseconds: one deadline, the last send's, serves them all.
        deadline = time.monotonic() + timeout + linger
        while by_fd:
            wait = deadline - time.monotonic()
            if wait <= 0:
                break
            for fd, _mask in epoll.poll(wait):
                i = by_fd[fd]
                outcome, strays = _receive(socks[i], ids[i], query, sent_at[i], timeout, ports[i])
                mismatched += strays
                if outcome is not None:
                    result[i] = outcome
                    del by_fd[fd]
                    epoll.unregister(fd)
    finally:
        epoll.close()
        for sock in socks.values():
            sock.close()
    outcomes = tuple(o if o is not None else Outcome(ports[i], failure="timeout") for i, o in enumerate(result))
    return CheckResult(server, query, timeout, outcomes, mismatched)


def _receive(
    sock: _socket.socket, qid: int, query: Query, sent_at: float, timeout: float, port: int
) -> tuple[Outcome | None, int]:
    """Read what is queued on one query's socket: its outcome once decided, and how many strays were read."""
    strays = 0
    want = qid.to_bytes(2, "big")
    while True:
        try:
            data, arrived = recv_stamped(sock)
        except BlockingIOError:
            return None, strays
        except ConnectionRefusedError:
            return Outcome(port, failure="refused"), strays
        except OSError as exc:
            return Outcome(port, failure=errno_name(exc)), strays
        rcode = response_rcode(data, want, query.question)
        if rcode is None:
            strays += 1
            continue
        elapsed = (arrived or time.time()) - sent_at
        if elapsed <= timeout:
            return Outcome(port, latency=elapsed, rcode=rcode), strays
        return Outcome(port, late=elapsed, rcode=rcode), strays


def format_check(result: CheckResult) -> str:
    n = len(result.outcomes)
    wait = format_duration(result.timeout)
    lines = [
        f"dns check {format_hostport(*result.server)}: {n} queries for {result.query.describe()}, "
        f"each from its own source port, sent at once, wait {wait}",
    ]
    failures = result.failures()
    detail = ", ".join(f"{k} {v}" for k, v in sorted(failures.items()))
    lines.append(f"answered    {result.answered}/{n} within {wait}" + (f" ({detail})" if detail else ""))
    summary = result.latency
    lines.append("latency ms  " + (summary.line() if summary else "-"))
    late = Summary.of(o.late for o in result.outcomes if o.late is not None)
    if late:
        lines.append("late ms     " + late.line())
    rcodes = result.rcodes()
    if rcodes:
        lines.append("rcodes      " + " ".join(f"{k}={v}" for k, v in sorted(rcodes.items())))
    if result.mismatched:
        lines.append(f"mismatched  {result.mismatched} datagrams with another ID or question (ignored)")
    if result.healthy:
        lines.append("healthy")
    else:
        lines.append(f"unhealthy: {n - result.answered} of {n} queries not answered within {wait}")
    return "\n".join(lines)

"""The test's handle on a running load balancer (`lb.py`): its output, read as it comes, and
waits on it.

    lb = LoadBalancer.start(bed.lb, nodes, port=30080, health_port=32000, log=...)
    lb.wait_health({"node-1"})            # the balancer now sends to node-1 only
    mark = lb.mark()                      # requests from here on ...
    ...
    lb.requests(since=mark), lb.failures(since=mark)
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from kubeproxy.lab import netns as L
from kubeproxy.lab.cluster import ClusterError


@dataclass(frozen=True)
class Request:
    node: str | None
    ok: bool
    answer: dict[str, str] | None  # what the pod saw: {"dst", "src"}
    error: str
    t: float


@dataclass(frozen=True)
class HealthChange:
    healthy: frozenset[str]
    t: float
    index: int  # how many requests had been made before it


@dataclass
class LoadBalancer:
    proc: subprocess.Popen[str]
    log: IO[str]
    _requests: list[Request] = field(default_factory=list)
    _health: list[HealthChange] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _reader: threading.Thread | None = None

    @classmethod
    def start(
        cls,
        ns: L.NetNS,
        nodes: Iterable[tuple[str, str]],
        *,
        port: int,
        log: IO[str],
        health_port: int = 0,
        proxy_healthz: int = 0,
        rate: float = 50.0,
        interval: float = 0.1,
        timeout: float = 1.0,
    ) -> LoadBalancer:
        """Run the balancer in `ns` for `nodes` ((name, ip)), sending to their NodePort `port`."""
        argv = [sys.executable, "-m", "kubeproxy.lab.multinode.lb", "--port", str(port)]
        argv += [a for name, ip in nodes for a in ("--node", f"{name}={ip}")]
        argv += ["--health-port", str(health_port), "--proxy-healthz", str(proxy_healthz)]
        argv += ["--rate", str(rate), "--interval", str(interval), "--timeout", str(timeout)]
        proc = ns.popen(argv, stdout=subprocess.PIPE, stderr=log)
        lb = cls(proc, log)
        lb._reader = threading.Thread(target=lb._read, name="lb output", daemon=True)
        lb._reader.start()
        return lb

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            record: dict[str, Any] = json.loads(line)
            with self._cond:
                if "health" in record:
                    self._health.append(HealthChange(frozenset(record["health"]), record["t"], len(self._requests)))
                else:
                    request = Request(record["node"], record["ok"], record.get("answer"), record.get("error", ""), record["t"])
                    self._requests.append(request)
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def stop(self, timeout: float = 10) -> None:
        L.stop_process(self.proc, timeout)
        if self._reader is not None:
            self._reader.join(timeout)

    # ---- what it did ---------------------------------------------------------------------

    @property
    def healthy(self) -> frozenset[str] | None:
        """The healthy set the balancer last reported (None before its first round)."""
        with self._cond:
            return self._health[-1].healthy if self._health else None

    def health_changes(self) -> list[HealthChange]:
        with self._cond:
            return list(self._health)

    def mark(self) -> int:
        """A position in the request log, for `requests(since=...)`."""
        with self._cond:
            return len(self._requests)

    def requests(self, since: int = 0, until: int | None = None) -> list[Request]:
        with self._cond:
            return self._requests[since:until]

    def failures(self, since: int = 0, until: int | None = None) -> list[Request]:
        return [r for r in self.requests(since, until) if not r.ok]

    def per_node(self, since: int = 0, until: int | None = None) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for r in self.requests(since, until):
            counts[r.node] = counts.get(r.node, 0) + 1
        return counts

    # ---- waits -----------------------------------------------------------------------------

    def wait_health(self, want: Sequence[str] | set[str] | frozenset[str], timeout: float = 15) -> HealthChange:
        """Until the balancer reports exactly `want` healthy; returns that report."""
        target = frozenset(want)

        def reached() -> bool:
            return bool(self._health) and self._health[-1].healthy == target

        with self._cond:
            if not self._cond.wait_for(lambda: reached() or self.proc.poll() is not None, timeout):
                seen = sorted(self._health[-1].healthy) if self._health else "nothing yet"
                raise ClusterError(
                    f"timed out after {timeout:g} s waiting for the LB to find {sorted(target)} healthy; it has {seen}"
                )
            if not reached():
                raise ClusterError(f"the load balancer exited with status {self.proc.returncode}")
            return self._health[-1]

    def wait_requests(self, count: int, since: int | None = None, timeout: float = 15) -> None:
        """Until `count` requests were made after `since` (default: now)."""
        start = self.mark() if since is None else since
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._requests) - start >= count or self.proc.poll() is not None, timeout):
                raise ClusterError(
                    f"timed out after {timeout:g} s waiting for {count} LB requests; {len(self._requests) - start} made"
                )
            if len(self._requests) - start < count:
                raise ClusterError(f"the load balancer exited with status {self.proc.returncode}")

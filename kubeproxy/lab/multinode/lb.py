"""A small external load balancer for the multi-node lab, run in its own namespace:

    python -m kubeproxy.lab.multinode.lb --node node-1=192.168.10.11 --node node-2=... --port 30080 \\
        [--health-port 32000] [--proxy-healthz 10256] [--interval 0.1] [--rate 50] [--timeout 1]

It does what a cloud load balancer in front of NodePorts does: it polls every node's health
(the service's healthCheckNodePort `/healthz`, as clouds do for externalTrafficPolicy Local;
and/or kube-proxy's own `/healthz` on 10256, which fails while the node is being deleted) and
sends only to the nodes that passed their last check. Here it is also the traffic source: it
opens one TCP connection per request to `node-ip:port`, round robin over the healthy nodes,
paced at `--rate` per second, and reads the lab probe's answer (what the pod saw).

One thread does both, in turn, so a health change is in force for every request after the
line that reports it: no request is in flight to a node once its removal has been printed.

Output, one JSON object a line on stdout:
    {"health": ["node-1", ...], "t": ...}        the healthy set, first after the first round
                                                 and then whenever it changes
    {"node": "node-1", "ok": true, "answer": {"dst": ..., "src": ...}, "t": ...}
    {"node": "node-1", "ok": false, "error": "timeout", "t": ...}
    {"node": null, "ok": false, "error": "no healthy node", "t": ...}  (at most once a second)
It runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import click

HEALTH_PATH = "/healthz"


@dataclass(frozen=True)
class Target:
    name: str
    ip: str


@dataclass
class Balancer:
    targets: tuple[Target, ...]
    port: int
    health_port: int = 0  # the service's healthCheckNodePort; 0: not checked
    proxy_healthz: int = 0  # kube-proxy's healthz port (10256); 0: not checked
    interval: float = 0.1
    rate: float = 50.0
    timeout: float = 1.0
    healthy: tuple[str, ...] = ()
    out: Callable[[dict[str, Any]], None] = field(default=lambda record: emit(record))  # where records go
    _turn: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        next_check = next_send = time.monotonic()
        last_empty = 0.0
        first = True
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_check:
                healthy = tuple(t.name for t in self.targets if self._passes(t))
                if first or healthy != self.healthy:
                    self.healthy = healthy
                    self.out({"health": list(healthy)})
                    first = False
                next_check = time.monotonic() + self.interval
            if self.rate and now >= next_send:
                if self.healthy:
                    name = self.healthy[self._turn % len(self.healthy)]
                    self._turn += 1
                    target = next(t for t in self.targets if t.name == name)
                    self.out({"node": name, **probe(target.ip, self.port, self.timeout)})
                elif now - last_empty >= 1.0:
                    self.out({"node": None, "ok": False, "error": "no healthy node"})
                    last_empty = now
                next_send = max(next_send + 1 / self.rate, now)
            wake = min(next_check, next_send if self.rate else next_check)
            # Pacing only: the loop's own schedule, not a wait for another process.
            self._stop.wait(max(0.0, wake - time.monotonic()))

    def _passes(self, target: Target) -> bool:
        ports = [p for p in (self.health_port, self.proxy_healthz) if p]
        return all(http_status(target.ip, p, HEALTH_PATH, self.timeout) == 200 for p in ports)


def http_status(ip: str, port: int, path: str, timeout: float) -> int | None:
    """The status of one GET, or None when the node did not answer (refused, timed out)."""
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def probe(ip: str, port: int, timeout: float) -> dict[str, Any]:
    """One TCP connection to the lab probe behind `ip:port`: {"ok", "answer" | "error"}."""
    try:
        with socket.create_connection((ip, port), timeout=timeout) as s:
            data = s.recv(2048)
    except ConnectionRefusedError:
        return {"ok": False, "error": "refused"}
    except TimeoutError:
        return {"ok": False, "error": "timeout"}
    except OSError as exc:
        return {"ok": False, "error": exc.strerror or str(exc)}
    try:
        return {"ok": True, "answer": json.loads(data.decode())}
    except ValueError:
        return {"ok": False, "error": "garbled"}


def emit(record: dict[str, Any]) -> None:
    print(json.dumps({**record, "t": time.time()}), flush=True)


def _targets(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[Target, ...]:
    out = []
    for spec in value:
        name, sep, ip = spec.partition("=")
        if not sep or not name or not ip:
            raise click.BadParameter(f"{spec!r}: want NAME=IP")
        out.append(Target(name, ip))
    return tuple(out)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--node", "targets", multiple=True, required=True, callback=_targets, help="NAME=IP, one per node.")
@click.option("--port", type=int, required=True, help="The service's NodePort.")
@click.option("--health-port", type=int, default=0, help="The service's healthCheckNodePort (0: not checked).")
@click.option("--proxy-healthz", type=int, default=0, help="kube-proxy's healthz port, 10256 (0: not checked).")
@click.option("--interval", type=float, default=0.1, show_default=True, help="Seconds between health rounds.")
@click.option("--rate", type=float, default=50.0, show_default=True, help="Requests per second (0: health checks only).")
@click.option("--timeout", type=float, default=1.0, show_default=True)
def main(
    targets: tuple[Target, ...], port: int, health_port: int, proxy_healthz: int, interval: float, rate: float, timeout: float
) -> None:
    """The multi-node lab's load balancer: sends to the NodePort of the nodes that pass their health checks."""
    if not health_port and not proxy_healthz:
        raise click.UsageError("give --health-port, --proxy-healthz or both: the balancer follows health checks")
    balancer = Balancer(targets, port, health_port, proxy_healthz, interval, rate, timeout)

    def stop(signum: int, frame: FrameType | None) -> None:
        balancer.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    balancer.run()


if __name__ == "__main__":
    main()

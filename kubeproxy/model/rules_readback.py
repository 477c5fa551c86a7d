"""What a node's rules do with each service port, read back from the kernel: the answers every
mode's reader gives (`backends/<mode>/readback.py`, named by its `Mode.readback`), for the
lab's beds, which wait on the kernel rather than on the proxy's word.

A reader takes one snapshot of the node's rules and answers, per service port (`ns/name:port`,
as upstream names it), where its packets are sent, whether they are rejected for want of
endpoints, and whether anything of a Service is left. Rules that do not name the service port
(nftables' shared maps, IPVS's virtual servers) are looked up by the port's keys, which the
reader is given from the Service objects (`service_ports`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kubeproxy.cluster.objects import kind_of, parse_service
from kubeproxy.model.options import Family

JSON = dict[str, Any]
# `run(argv, check=...)` inside the node, returning a CompletedProcess (NetNS.run).
Run = Callable[..., Any]


@dataclass(frozen=True)
class ServicePortKeys:
    """Where one service port is reached: its addresses and ports, the keys rules look it up by."""

    service: str  # ns/name
    protocol: str  # tcp, udp, sctp
    port: int
    addresses: tuple[str, ...]  # cluster IP, external IPs, load-balancer IPs
    node_port: int = 0


def published(ports: Mapping[str, ServicePortKeys], service_port: str) -> ServicePortKeys:
    """The keys of `service_port` (`ns/name:port`); a KeyError naming the ones there are."""
    try:
        return ports[service_port]
    except KeyError:
        known = ", ".join(sorted(ports)) or "none"
        raise KeyError(f"{service_port}: no Service of that port was published (known: {known})") from None


def service_ports(objs: Iterable[JSON]) -> dict[str, ServicePortKeys]:
    """`ns/name:port` → its keys, for every port of the Services among `objs` (later ones win)."""
    out: dict[str, ServicePortKeys] = {}
    for obj in objs:
        if kind_of(obj) != "Service":
            continue
        svc = parse_service(obj)
        ingress = [i.ip for i in svc.load_balancer_ingress if i.ip is not None]
        addresses = tuple(str(ip) for ip in (*svc.cluster_ips[:1], *svc.external_ips, *ingress))
        for port in svc.ports:
            name = svc.ref + (f":{port.name}" if port.name else "")
            out[name] = ServicePortKeys(svc.ref, port.protocol.lower(), port.port, addresses, port.node_port)
    return out


def names(service: str) -> re.Pattern[str]:
    """Matches `service` (`default/web`) but not a longer name (`default/web2`): names are DNS labels."""
    return re.compile(re.escape(service) + r"(?![a-z0-9.-])")


class NodeRules(Protocol):
    """One snapshot of the node's rules."""

    @property
    def text(self) -> str:
        """The dump the answers come from, for messages."""
        ...

    def endpoints(self, service_port: str) -> set[str]:
        """Every `ip:port` the rules may send the port's new connections to (any of its addresses)."""
        ...

    def rejects(self, service_port: str) -> bool:
        """Whether the port's cluster IP traffic is rejected because it has no endpoints."""
        ...

    def mentions(self, service: str) -> bool:
        """Whether anything of the service `ns/name` is still in the rules."""
        ...


# A mode's reader: its readback module's `read_rules(run, ports, family)`.
Reader = Callable[[Run, Mapping[str, ServicePortKeys], Family], NodeRules]

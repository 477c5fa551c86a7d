"""Localhost NodePorts in nftables mode (the KubeProxyNFTablesLocalhostNodePorts gate).

nftables mode never DNATs loopback destinations (that would need route_localnet, which lets
remote hosts reach 127.0.0.1). Upstream v1.37 serves TCP NodePorts on the loopback address
instead from userspace: when nodePortAddresses names loopback explicitly (`localhost`,
127.0.0.0/8, ::1/128), kube-proxy listens on 127.0.0.1:<nodePort> (::1 for IPv6) and relays
each connection to one of the service port's endpoints (the Cluster-policy ones, or the
node-local ones for externalTrafficPolicy: Local); a NodePort without endpoints gets no
listener. Other protocols are rejected and counted by the rules (render.py).

The relay is the userspace mode's (backends/userspace/relay_loop.py): its own thread and loop, so a
sync never waits on traffic. Differences from upstream's relay, kept: endpoints are taken in
round robin rather than at random, and a failed connect is retried on the next endpoint.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field

from kubeproxy.backends.userspace.balancer import PortTable
from kubeproxy.backends.userspace.relay_loop import Listener, RelayServer
from kubeproxy.model.node_model import NodeView, ServicePortName
from kubeproxy.model.options import Family, NodeOptions
from kubeproxy.model.topology import categorize
from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.nftables")

LISTEN_BACKLOG = 1024


def wanted_tables(view: NodeView, opts: NodeOptions) -> dict[ServicePortName, tuple[int, PortTable]]:
    """(NodePort, relay table) of every TCP NodePort that has endpoints to relay to."""
    out: dict[ServicePortName, tuple[int, PortTable]] = {}
    for name, svc in view.services.items():
        if not svc.node_port or svc.protocol != "TCP":
            continue
        cat = categorize(view.endpoints.get(name, ()), svc, opts.node_name, opts.node_labels,
                         prefer_same_node=opts.prefer_same_node)  # fmt: skip
        chosen = cat.local if svc.external_policy_local else cat.cluster
        if not chosen:
            continue
        table = PortTable(
            name,
            "TCP",
            tuple((e.ip, e.port) for e in chosen),
            affinity=svc.client_ip_affinity,
            affinity_timeout=float(svc.sticky_max_age_seconds),
        )
        out[name] = (svc.node_port, table)
    return out


def listen(family: Family, port: int) -> socket.socket:
    """A TCP listener on the family's loopback address; OSError if the port is taken."""
    sock = socket.socket(socket.AF_INET6 if family.ipv6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if family.ipv6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((family.loopback, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


@dataclass
class LocalhostNodePorts:
    """The listeners of one IP family. `sync` is called after each sync of the rules."""

    family: Family = Family.IPV4
    relay: RelayServer = field(default_factory=RelayServer)
    creation_failures: int = 0  # kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total
    _ports: dict[ServicePortName, int] = field(default_factory=dict, init=False)

    @property
    def listeners(self) -> int:
        """kubeproxy_nftables_localhost_nodeport_listeners."""
        return len(self._ports)

    def sync(self, view: NodeView, opts: NodeOptions) -> None:
        wanted = wanted_tables(view, opts)
        self.relay.start()
        closed = [name for name, port in self._ports.items() if name not in wanted or wanted[name][0] != port]
        if closed:
            # Closed first: a NodePort that moved to another Service port is bound again below.
            self.relay.call(self.relay.adopt, [], {}, closed)
            for name in closed:
                log.info(kv("Removing localhost nodeport proxy", protocol="TCP", port=self._ports.pop(name)))
        opened: list[Listener] = []
        tables: dict[ServicePortName, PortTable] = {}
        for name, (port, table) in wanted.items():
            if name not in self._ports:
                try:
                    sock = listen(self.family, port)
                except OSError as exc:
                    self.creation_failures += 1
                    log.error(kv("Failed to create localhost nodeport proxy", protocol="TCP", port=port, err=exc))
                    continue
                opened.append(Listener(name, "TCP", sock, port))
                self._ports[name] = port
            tables[name] = table
        self.relay.call(self.relay.adopt, opened, tables, [])

    def stop(self) -> None:
        self.relay.stop()
        self._ports.clear()

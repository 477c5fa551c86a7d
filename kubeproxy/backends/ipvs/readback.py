"""An IPVS-mode node's kernel state read back per service port (model/rules_readback.py).

IPVS mode sends a service port's packets to its endpoints through virtual servers, not DNAT
rules: `ipvsadm-save -n` lists one virtual server per address and port of the service (cluster
IP, external and load-balancer IPs, the NodePort on each node address) with a real server per
endpoint. So, as for nftables, the reader is given the ports' keys and looks each up in that table.

A real server at weight 0 is an endpoint being removed (graceful termination keeps it until its
connections are gone): it takes no new connection, so it is not among the port's endpoints.
A port without endpoints keeps its virtual server with no real server; the kernel answers such
a packet with ICMP port unreachable (ip_vs_leave), which is a rejection as the other modes' REJECT.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kubeproxy.backends.ipvs.apply import parse_ipvsadm_save
from kubeproxy.backends.ipvs.render import RealServer, VirtualServer
from kubeproxy.model.options import Family
from kubeproxy.model.rules_readback import NodeRules, Run, ServicePortKeys, published


def read_rules(run: Run, ports: Mapping[str, ServicePortKeys], family: Family = Family.IPV4) -> NodeRules:
    """`ipvsadm-save -n`, which lists both families' virtual servers; the ports' keys pick `family`'s."""
    return IpvsRules(str(run(["ipvsadm-save", "-n"]).stdout), ports)


@dataclass
class IpvsRules:
    """`ipvsadm-save -n` of the node (`save`) read against the published Services' keys."""

    save: str
    ports: Mapping[str, ServicePortKeys]
    table: dict[VirtualServer, list[RealServer]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.table = parse_ipvsadm_save(self.save)

    @property
    def text(self) -> str:
        return self.save

    def _keys(self, service_port: str) -> ServicePortKeys:
        return published(self.ports, service_port)

    def _servers(self, keys: ServicePortKeys) -> list[tuple[VirtualServer, list[RealServer]]]:
        """The port's virtual servers: on each of its addresses, and on any address at its NodePort."""
        proto = keys.protocol.upper()
        return [
            (vs, reals)
            for vs, reals in self.table.items()
            if vs.protocol == proto
            and ((vs.address in keys.addresses and vs.port == keys.port) or (keys.node_port and vs.port == keys.node_port))
        ]

    def endpoints(self, service_port: str) -> set[str]:
        return {f"{r.address}:{r.port}" for _, reals in self._servers(self._keys(service_port)) for r in reals if r.weight > 0}

    def rejects(self, service_port: str) -> bool:
        keys = self._keys(service_port)
        if not keys.addresses:
            return False
        cluster_ip = keys.addresses[0]
        return any(vs.address == cluster_ip and not any(r.weight > 0 for r in reals) for vs, reals in self._servers(keys))

    def mentions(self, service: str) -> bool:
        return any(self._servers(p) for p in self.ports.values() if p.service == service)

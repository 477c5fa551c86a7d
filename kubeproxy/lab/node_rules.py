"""What a node's kernel rules say about each service port, in either proxy mode.

The test beds wait on the kernel, not on the proxy's word: `read(mode, run, services)` takes one
snapshot of the node's rules and answers, per service port (`ns/name:port`, as upstream names
it), where its packets are DNATed to, whether they are rejected for want of endpoints, and
whether anything of a service is left.

iptables mode reads `iptables-save`: upstream's rule comments name the service port. The
nftables table names no service port in its shared maps (render.py: `service-ips` sends
`address . proto . port` to a selector shared by every port with as many endpoints, whose map
is keyed by the same fields plus an index), so the snapshot is given the Service objects and
follows each of the port's keys (cluster IP, external and load-balancer IPs, NodePort) through
the verdict maps, the chains and the DNAT maps to the endpoint addresses.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from kubeproxy.backends.nftables.render import (
    CLUSTER_IPS,
    FIREWALL_IPS,
    NO_ENDPOINT_NODEPORTS,
    NO_ENDPOINT_SERVICES,
    REJECT_CHAIN,
    SERVICE_IPS,
    SERVICE_NODEPORTS,
)
from kubeproxy.backends.nftables.table_objects import TABLE
from kubeproxy.cluster.objects import kind_of, parse_service

JSON = dict[str, Any]
Key = tuple[str, ...]
# `run(argv, check=...)` inside the node, returning a CompletedProcess (NetNS.run).
Run = Callable[..., Any]
MODES = ("iptables", "nftables")
# ipvs needs a kernel with IPVS (the host's has none): its beds run in the VM (tests/vm), not in MODES.
KNOWN_MODES = (*MODES, "ipvs", "userspace")


@dataclass(frozen=True)
class ServicePortKeys:
    """Where one service port is reached: the keys of the nftables maps that lead to it."""

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


class NodeRules(Protocol):
    """One snapshot of the node's rules."""

    mode: str

    @property
    def text(self) -> str:
        """The dump the answers come from, for messages."""
        ...

    def endpoints(self, service_port: str) -> set[str]:
        """Every `ip:port` the rules may DNAT the port's traffic to (any of its addresses)."""
        ...

    def rejects(self, service_port: str) -> bool:
        """Whether the port's cluster IP traffic is rejected because it has no endpoints."""
        ...

    def mentions(self, service: str) -> bool:
        """Whether anything of the service `ns/name` is still in the rules."""
        ...


def read(mode: str, run: Run, services: Iterable[JSON] = ()) -> NodeRules:
    """A snapshot of the rules a proxy in `mode` programs; nftables needs the Service objects."""
    if mode == "iptables":
        return IptablesRules(run)
    if mode == "nftables":
        proc = run(["nft", "-j", "list", "table", "ip", TABLE], check=False)
        return NftRules(proc.stdout if proc.returncode == 0 else "", service_ports(services))
    if mode == "ipvs":
        from kubeproxy.lab.ipvs_rules import IpvsRules  # imports this module's ServicePortKeys

        return IpvsRules(str(run(["ipvsadm-save", "-n"]).stdout), service_ports(services))
    if mode == "userspace":
        from kubeproxy.lab.userspace_rules import UserspaceRules  # the proxy's state file and its redirects

        return UserspaceRules.read(run)
    raise ValueError(f"proxy mode {mode!r}: want one of {', '.join(KNOWN_MODES)}")


def _names(service: str) -> re.Pattern[str]:
    # `default/web` but not `default/web2`: names are DNS labels.
    return re.compile(re.escape(service) + r"(?![a-z0-9.-])")


@dataclass
class IptablesRules:
    """`iptables-save` of the nat table (and of filter, read when first needed)."""

    run: Run
    mode: str = field(default="iptables", init=False)

    def _save(self, table: str) -> str:
        return str(self.run(["iptables-save", "-t", table]).stdout)

    @cached_property
    def nat(self) -> str:
        return self._save("nat")

    @cached_property
    def filter(self) -> str:
        return self._save("filter")

    @property
    def text(self) -> str:
        return self.nat + self.filter

    def endpoints(self, service_port: str) -> set[str]:
        found = set()
        for line in self.nat.splitlines():
            if not (line.startswith("-A KUBE-SEP-") and "--to-destination" in line):
                continue
            words = shlex.split(line)
            if "--comment" in words and words[words.index("--comment") + 1] == service_port:
                found.add(words[words.index("--to-destination") + 1])
        return found

    def rejects(self, service_port: str) -> bool:
        return f'"{service_port} has no endpoints"' in self.filter

    def mentions(self, service: str) -> bool:
        pattern = _names(service)
        return bool(pattern.search(self.nat) or pattern.search(self.filter))


@dataclass
class NftRules:
    """`nft -j list table ip kube-proxy` ("" when there is no table) and the Services' keys."""

    dump: str
    ports: Mapping[str, ServicePortKeys]
    mode: str = field(default="nftables", init=False)
    # set/map name → [(key, value or None, comment or None)]; chain name → rules' statements
    elements: dict[str, list[tuple[Key, Any, str | None]]] = field(default_factory=dict, init=False)
    chains: dict[str, list[list[JSON]]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        doc = json.loads(self.dump) if self.dump else {}
        for obj in doc.get("nftables", []):
            if "chain" in obj:
                self.chains.setdefault(obj["chain"]["name"], [])
            elif "rule" in obj:
                self.chains.setdefault(obj["rule"]["chain"], []).append(obj["rule"]["expr"])
            for kind in ("set", "map"):
                if kind in obj:
                    body = obj[kind]
                    self.elements[body["name"]] = [_element(e, kind == "map") for e in body.get("elem", [])]

    @property
    def text(self) -> str:
        return self.dump

    def _keys(self, service_port: str) -> ServicePortKeys:
        return published(self.ports, service_port)

    def _lookup(self, name: str, key: Key) -> Any:
        return next((value for k, value, _ in self.elements.get(name, []) if k == key), None)

    def endpoints(self, service_port: str) -> set[str]:
        keys = self._keys(service_port)
        found: set[str] = set()
        entries: list[tuple[str, Key]] = [(SERVICE_IPS, (addr, keys.protocol, str(keys.port))) for addr in keys.addresses]
        if keys.node_port:
            entries.append((SERVICE_NODEPORTS, (keys.protocol, str(keys.node_port))))
        for vmap, key in entries:
            target = _target(self._lookup(vmap, key))
            if target:
                self._follow(target, key, found, set())
        return found

    def _follow(self, chain: str, key: Key, found: set[str], seen: set[str]) -> None:
        """DNAT targets reachable from `chain` for a packet whose map key starts with `key`."""
        if chain in seen:
            return
        seen.add(chain)
        for statements in self.chains.get(chain, []):
            for stmt in statements:
                if "dnat" in stmt:
                    found |= self._dnat(stmt["dnat"], key)
                target = _target(stmt)
                if target:
                    self._follow(target, key, found, seen)

    def _dnat(self, dnat: JSON, key: Key) -> set[str]:
        addr = dnat.get("addr")
        if isinstance(addr, str):
            return {f"{addr}:{dnat['port']}"}
        if isinstance(addr, dict) and "map" in addr:
            name = str(addr["map"]["data"]).lstrip("@")
            # selector maps: key fields . endpoint index → address . port
            return {f"{v[0]}:{v[1]}" for k, v, _ in self.elements.get(name, []) if k[: len(key)] == key and v}
        return set()

    def rejects(self, service_port: str) -> bool:
        keys = self._keys(service_port)
        cluster_ip = (keys.addresses[0], keys.protocol, str(keys.port)) if keys.addresses else None
        return any(
            k == cluster_ip and comment == service_port and _target(value) == REJECT_CHAIN
            for k, value, comment in self.elements.get(NO_ENDPOINT_SERVICES, [])
        )

    def mentions(self, service: str) -> bool:
        ports = [p for p in self.ports.values() if p.service == service]
        addresses = {a for p in ports for a in p.addresses}
        node_ports = {(p.protocol, str(p.node_port)) for p in ports if p.node_port}
        named = _names(service)
        for name, elements in self.elements.items():
            for k, _, comment in elements:
                if comment and named.search(comment):
                    return True
                if name in (CLUSTER_IPS, SERVICE_IPS, NO_ENDPOINT_SERVICES, FIREWALL_IPS) and k[0] in addresses:
                    return True
                if name in (SERVICE_NODEPORTS, NO_ENDPOINT_NODEPORTS) and k[:2] in node_ports:
                    return True
        # ClientIP affinity gives a service chains of its own: `service-HASH-ns/name/proto/port`
        return any(f"-{service}/" in chain for chain in self.chains)


def _element(raw: Any, is_map: bool) -> tuple[Key, Any, str | None]:
    key, value = (raw[0], raw[1]) if is_map else (raw, None)
    comment = None
    if isinstance(key, dict) and "elem" in key:
        comment = key["elem"].get("comment")
        key = key["elem"]["val"]
    if isinstance(value, dict) and "concat" in value:
        value = tuple(str(v) for v in value["concat"])
    return _fields(key), value, comment


def _fields(key: Any) -> Key:
    if isinstance(key, dict) and "concat" in key:
        return tuple(str(v) for v in key["concat"])
    return (str(key),)


def _target(value: Any) -> str | None:
    """The chain a verdict (or a rule's statement) goes to or jumps to."""
    if isinstance(value, dict):
        for verdict in ("goto", "jump"):
            if verdict in value:
                return str(value[verdict]["target"])
    return None

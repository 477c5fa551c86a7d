"""An nftables-mode node's rules read back per service port (model/rules_readback.py).

The table names no service port in its shared maps (render.py: `service-ips` sends
`address . proto . port` to a selector shared by every port with as many endpoints, whose map
is keyed by the same fields plus an index), so the reader is given the ports' keys and follows
each of them (cluster IP, external and load-balancer IPs, NodePort) through the verdict maps,
the chains and the DNAT maps to the endpoint addresses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
from kubeproxy.model.options import Family
from kubeproxy.model.rules_readback import JSON, NodeRules, Run, ServicePortKeys, names, published

Key = tuple[str, ...]


def read_rules(run: Run, ports: Mapping[str, ServicePortKeys], family: Family = Family.IPV4) -> NodeRules:
    """`nft -j list table ip kube-proxy` (`ip6` for IPv6) of the node, read against the ports' keys."""
    proc = run(["nft", "-j", "list", "table", family.nft, TABLE], check=False)
    return NftRules(proc.stdout if proc.returncode == 0 else "", ports)


@dataclass
class NftRules:
    """`nft -j list table ip kube-proxy` ("" when there is no table) and the Services' keys."""

    dump: str
    ports: Mapping[str, ServicePortKeys]
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
        named = names(service)
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

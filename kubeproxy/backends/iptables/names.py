"""Chain names, byte-compatible with upstream so that users can grep for them.

A service chain is a prefix plus the first 16 characters of base32(sha256(servicePortName +
protocol)); an endpoint chain also hashes the endpoint's ip:port. Chain names must be at most
28 characters; this keeps them at 25.
"""

from __future__ import annotations

import base64
import hashlib

SERVICE_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-")


def port_proto_hash(service_port_name: str, protocol: str) -> str:
    digest = hashlib.sha256((service_port_name + protocol).encode()).digest()
    return base64.b32encode(digest).decode()[:16]


def service_chain(service_port_name: str, protocol: str) -> str:
    """KUBE-SVC-: dispatch to all usable endpoints (Cluster traffic policy)."""
    return "KUBE-SVC-" + port_proto_hash(service_port_name, protocol)


def local_chain(service_port_name: str, protocol: str) -> str:
    """KUBE-SVL-: dispatch to this node's endpoints only (Local traffic policy)."""
    return "KUBE-SVL-" + port_proto_hash(service_port_name, protocol)


def external_chain(service_port_name: str, protocol: str) -> str:
    """KUBE-EXT-: entry for NodePort, external and load-balancer IP traffic."""
    return "KUBE-EXT-" + port_proto_hash(service_port_name, protocol)


def firewall_chain(service_port_name: str, protocol: str) -> str:
    """KUBE-FW-: loadBalancerSourceRanges filter."""
    return "KUBE-FW-" + port_proto_hash(service_port_name, protocol)


def endpoint_chain(service_port_name: str, protocol: str, endpoint: str) -> str:
    """KUBE-SEP-: masquerade hairpin traffic and DNAT to one endpoint."""
    digest = hashlib.sha256((service_port_name + protocol + endpoint).encode()).digest()
    return "KUBE-SEP-" + base64.b32encode(digest).decode()[:16]


def is_service_chain(name: str) -> bool:
    return name.startswith(SERVICE_CHAIN_PREFIXES)

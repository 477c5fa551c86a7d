"""Chain names, byte-compatible with upstream so that users can grep for them.

A service chain is a prefix plus the first 16 characters of base32(sha256(servicePortName +
protocol)); an endpoint chain also hashes the endpoint's ip:port. Chain names must be at most
28 characters; this keeps them at 25.
"""

from __future__ import annotations

import hashlib

SERVICE_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-")

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# Two base32 digits per 10 bits: the 16 digits we keep are the first 80 bits of the digest.
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]


def _base32_16(data: bytes) -> str:
    """base64.b32encode(data)[:16], without encoding the 22 digits we would throw away.

    Rendering 10k services x 10 endpoints hashes 200k+ endpoint chain names; the standard
    library's pure-Python encoder was most of the render time.
    """
    n = int.from_bytes(data[:10], "big")
    pairs = _PAIRS
    return (
        pairs[n >> 70] + pairs[(n >> 60) & 1023] + pairs[(n >> 50) & 1023] + pairs[(n >> 40) & 1023]
        + pairs[(n >> 30) & 1023] + pairs[(n >> 20) & 1023] + pairs[(n >> 10) & 1023] + pairs[n & 1023]
    )


def port_proto_hash(service_port_name: str, protocol: str) -> str:
    return _base32_16(hashlib.sha256((service_port_name + protocol).encode()).digest())


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


def chains_of(service_port_name: str, protocol: str) -> tuple[str, str, str, str]:
    """(KUBE-SVC-, KUBE-SVL-, KUBE-EXT-, KUBE-FW-) names of one service port: one hash for the four."""
    h = port_proto_hash(service_port_name, protocol)
    return "KUBE-SVC-" + h, "KUBE-SVL-" + h, "KUBE-EXT-" + h, "KUBE-FW-" + h


def endpoint_chain(service_port_name: str, protocol: str, endpoint: str) -> str:
    """KUBE-SEP-: masquerade hairpin traffic and DNAT to one endpoint."""
    return "KUBE-SEP-" + _base32_16(hashlib.sha256((service_port_name + protocol + endpoint).encode()).digest())


def is_service_chain(name: str) -> bool:
    return name.startswith(SERVICE_CHAIN_PREFIXES)

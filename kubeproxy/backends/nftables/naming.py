"""Names of our nftables objects.

Per-service chains use upstream's nftables names (`service-ULMVA6XW-ns1/svc1/tcp/p80`: the first
8 base32 characters of sha256 of the rest, then namespace/name/protocol/port), so users can grep
for them. Shared chains and maps are named by what they hold (`cluster-endpoints-3`); they never
contain a slash, which is how `is_service_chain` tells the two apart, as upstream does.
"""

from __future__ import annotations

import base64
import hashlib

from kubeproxy.cluster.addresses import AddressText
from kubeproxy.kernel.kernel_text import nft_name
from kubeproxy.model.node_model import ServicePortName

NAME_LENGTH_MAX = 256  # nft's limit (NFT_NAME_MAXLEN)
_PREFIX_LENGTH_MAX = 16
_BASE_LENGTH_MAX = NAME_LENGTH_MAX - _PREFIX_LENGTH_MAX


def _hash_and_truncate(name: str) -> str:
    digest = hashlib.sha256(name.encode()).digest()
    # The hash is of the name as given; only the readable part is made safe (kernel_text).
    # base32 turns each 5 bytes into 8 characters on their own: the first 8 of the whole
    # digest's encoding are those of its first 5 bytes (the pure-Python encoder is slow).
    out = base64.b32encode(digest[:5]).decode() + "-" + nft_name(name)
    return out if len(out) <= _BASE_LENGTH_MAX else out[: _BASE_LENGTH_MAX - 3] + "..."


def service_base(spn: ServicePortName) -> str:
    return _hash_and_truncate(f"{spn.namespace}/{spn.name}/{spn.protocol.lower()}/{spn.port}")


def endpoint_base(spn: ServicePortName, ip: AddressText, port: int) -> str:
    # Colons are not allowed in chain names: IPv6 addresses are written with dots.
    return _hash_and_truncate(f"{spn.namespace}/{spn.name}/{spn.protocol.lower()}/{spn.port}__{ip.replace(':', '.')}/{port}")


def cluster_chain(spn: ServicePortName) -> str:
    return "service-" + service_base(spn)


def local_chain(spn: ServicePortName) -> str:
    return "local-" + service_base(spn)


def external_chain(spn: ServicePortName) -> str:
    return "external-" + service_base(spn)


def firewall_chain(spn: ServicePortName) -> str:
    """Upstream's per-service chain for loadBalancerSourceRanges."""
    return "firewall-" + service_base(spn)


def firewall_set(spn: ServicePortName) -> str:
    """Ours: the interval set of a service port's allowed source ranges, used by its firewall chain."""
    return "firewall-allow-" + service_base(spn)


def endpoint_chain(spn: ServicePortName, ip: AddressText, port: int) -> str:
    return "endpoint-" + endpoint_base(spn, ip, port)


def affinity_id(endpoint_chain_name: str) -> int:
    """A 31-bit number standing for one endpoint of one service in the shared `affinity` set.

    31 bits because `nft -j` prints larger numgen offsets as negative numbers. Two endpoints
    that happen to share an id cannot misroute: a service chain only ever jumps to its own
    endpoints, so a collision can at worst make a client sticky a little early.
    """
    return int.from_bytes(hashlib.sha256(endpoint_chain_name.encode()).digest()[:4], "big") & 0x7FFFFFFF


def is_service_chain(name: str) -> bool:
    return "/" in name

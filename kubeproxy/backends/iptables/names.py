"""Chain names, byte-compatible with upstream so that users can grep for them.

A service chain is a prefix plus the first 16 characters of base32(sha256(servicePortName +
protocol)); an endpoint chain also hashes the endpoint's ip:port. Chain names must be at most
28 characters; this keeps them at 25.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

SERVICE_CHAIN_PREFIXES = ("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-")

_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# Two base32 digits per 10 bits: the 16 digits we keep are the first 80 bits of the digest.
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]


def _base32_16(data: bytes, pairs: list[str] = _PAIRS, from_bytes: Callable[..., int] = int.from_bytes) -> str:
    """base64.b32encode(data)[:16], without encoding the 22 digits we would throw away.

    Rendering 10k services x 10 endpoints hashes 200k+ endpoint chain names; the standard
    library's pure-Python encoder was most of the render time. One f-string instead of seven
    concatenations, and the table and int.from_bytes bound as defaults (no global lookups):
    a third less per name.
    """
    n = from_bytes(data[:10], "big")
    return (
        f"{pairs[n >> 70]}{pairs[(n >> 60) & 1023]}{pairs[(n >> 50) & 1023]}{pairs[(n >> 40) & 1023]}"
        f"{pairs[(n >> 30) & 1023]}{pairs[(n >> 20) & 1023]}{pairs[(n >> 10) & 1023]}{pairs[n & 1023]}"
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


def endpoint_chains(service_port_name: str, protocol: str, endpoints: Sequence[str]) -> list[str]:
    """endpoint_chain of each of `endpoints` (`ip:port`) of one service port, in order.

    One call per service port instead of one per endpoint (the renderer names 100k+ endpoints),
    and the digests are encoded together (`_base32_16_many`).
    """
    prefix = service_port_name + protocol
    sha256 = hashlib.sha256
    digests = [sha256((prefix + endpoint).encode()).digest() for endpoint in endpoints]
    if len(digests) < _MANY_FROM:
        return ["KUBE-SEP-" + _base32_16(digest) for digest in digests]
    return ["KUBE-SEP-" + text for text in _base32_16_many(digests)]


# _base32_16_many works on up to _SLOTS digests at once, each in a 128-bit slot of one integer
# (its 80 bits at the low end): the masks select, in every slot, the low 40 bits of each
# 64-bit part, the low 20 of each 32-bit part, and so on.
_SLOTS = 64
_MANY_FROM = 6  # below this the integer steps cost more than they save (measured)


def _repeated(pattern: int, period: int, count: int) -> int:
    return sum(pattern << (period * i) for i in range(count))


_LOW40 = _repeated((1 << 40) - 1, 128, _SLOTS)
_LOW20 = _repeated((1 << 20) - 1, 64, 2 * _SLOTS)
_LOW10 = _repeated((1 << 10) - 1, 32, 4 * _SLOTS)
_LOW5 = _repeated((1 << 5) - 1, 16, 8 * _SLOTS)
_DIGITS = bytes.maketrans(bytes(range(32)), _ALPHABET.encode())
_GAP = bytes(6)  # 16-byte slot, 10-byte value


def _base32_16_many(digests: list[bytes]) -> list[str]:
    """[_base32_16(d) for d in digests], with the bit shuffling done on all of them at once.

    Each 80-bit value is split in halves, quarters, ... down to one 5-bit digit per byte by four
    mask-and-shift steps on one big integer, and the bytes become digits by one translate:
    a few dozen C-level operations per call instead of 31 Python operations per digest.
    """
    out: list[str] = []
    for start in range(0, len(digests), _SLOTS):
        chunk = digests[start : start + _SLOTS]
        x = int.from_bytes(_GAP + _GAP.join([digest[:10] for digest in chunk]), "big")
        x = (x & _LOW40) | ((x >> 40) & _LOW40) << 64
        x = (x & _LOW20) | ((x >> 20) & _LOW20) << 32
        x = (x & _LOW10) | ((x >> 10) & _LOW10) << 16
        x = (x & _LOW5) | ((x >> 5) & _LOW5) << 8
        text = x.to_bytes(16 * len(chunk), "big").translate(_DIGITS).decode()
        out += [text[i : i + 16] for i in range(0, len(text), 16)]
    return out


def is_service_chain(name: str) -> bool:
    return name.startswith(SERVICE_CHAIN_PREFIXES)

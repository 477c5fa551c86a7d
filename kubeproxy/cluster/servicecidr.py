"""ServiceCIDR (networking.k8s.io/v1): the address ranges the cluster allocates ClusterIPs from.

nftables mode drops new connections to an address inside one of these ranges that no Service
holds (upstream's `cluster-ips-check` chain). Validated as the API server validates a new
ServiceCIDR (pkg/apis/networking/validation ValidateServiceCIDR): a DNS-subdomain name, one or
two CIDRs in canonical form (`10.96.0.0/16`, not `10.96.0.1/16` or `010.96.0.0/16`), and two
only when they are of different families.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubeproxy.cluster.fields import Fields, IPNetwork, object_ref
from kubeproxy.cluster.validation import dns1123_subdomain, show

KIND = "ServiceCIDR"


@dataclass(frozen=True)
class ServiceCIDR:
    name: str
    cidrs: tuple[IPNetwork, ...]


def parse_service_cidr(obj: Mapping[str, Any]) -> ServiceCIDR:
    """The ServiceCIDR in `obj`, or ObjectError naming it and the field the API server would refuse."""
    _, name, ref = object_ref(KIND, obj, namespaced=False)
    top = Fields(KIND, ref, obj)
    meta = top.map("metadata")
    meta.check("name", dns1123_subdomain(name))
    if meta.text("namespace"):
        raise meta.error("namespace", "not allowed on this type")
    spec = top.map("spec")
    texts = spec.strs("cidrs")
    if not texts:
        raise spec.error("cidrs", "at least one CIDR required")
    if len(texts) > 2:
        raise spec.error("cidrs", "may only hold up to 2 values")
    cidrs = tuple(_canonical_cidr(spec, i, text) for i, text in enumerate(texts))
    if len(cidrs) == 2 and cidrs[0].version == cidrs[1].version:
        raise spec.error("cidrs", "may specify no more than one IP for each IP family, i.e 192.168.0.0/24 and 2001:db8::/64")
    return ServiceCIDR(name, cidrs)


def _canonical_cidr(spec: Fields, index: int, text: str) -> IPNetwork:
    key = f"cidrs[{index}]"
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise spec.error(key, f"{show(text)}: must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)") from None
    if isinstance(net, ipaddress.IPv6Network) and net.network_address.ipv4_mapped is not None:
        raise spec.error(key, f"{show(text)}: must not be an IPv4-mapped IPv6 address")
    if str(net) != text:
        raise spec.error(key, f'{show(text)}: must be in canonical form ("{net}")')
    return net

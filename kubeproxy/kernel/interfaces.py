"""The addresses of the network interfaces in the proxy's namespace, read with `ip -o addr show`.

The live proxy matches nodePortAddresses CIDRs against them at every sync (as upstream's
NodePortAddresses.GetNodeIPs does with the interfaces' addresses), and IPVS mode puts NodePort
virtual servers on them. `kubeproxy render` has no interfaces to read and uses the Node's addresses.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from kubeproxy.kernel.exec import Runner

_FAMILIES = ("inet", "inet6")


@dataclass(frozen=True)
class InterfaceAddress:
    device: str
    ip: str

    @property
    def link_local(self) -> bool:
        return ipaddress.ip_address(self.ip).is_link_local


def interface_addresses(run: Runner) -> tuple[InterfaceAddress, ...]:
    """Every address of every interface, both families, in the kernel's order, without repeats.

    Raises what the runner raises when `ip` cannot be run or fails; a line that holds no
    address is skipped."""
    out = run(["ip", "-o", "addr", "show"], check=True).stdout
    found: dict[InterfaceAddress, None] = {}
    for line in out.splitlines():
        # `IDX: DEV    inet|inet6 ADDR/PLEN ...`
        words = line.split()
        if len(words) < 4 or words[2] not in _FAMILIES:
            continue
        try:
            ip = ipaddress.ip_address(words[3].split("/")[0])
        except ValueError:
            continue
        found[InterfaceAddress(words[1], str(ip))] = None
    return tuple(found)

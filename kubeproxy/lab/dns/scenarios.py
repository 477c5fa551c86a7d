"""The DNS lab's scenarios: which rules carry the external IP's DNS traffic to BIND.

Every scenario has the same world (kubeproxy.lab.dns.world) and the same DNS Service of the
seed's shape; they differ only in what the node does to a query for the external IP:

- `snat`: kube-proxy's behaviour, externalTrafficPolicy Cluster. The query is DNATed to a pod
  and masqueraded to the node's IP, so every query from a fresh source port needs its own SNAT
  source port on the node for as long as its conntrack entry lives (the UDP timeout).
- `dnat`: the seed's "manual DNAT iptables": one rule at the top of PREROUTING that DNATs new
  UDP queries for the external IP straight to the pod, ahead of kube-proxy's rules. The pod sees
  the client's address; nothing is masqueraded.
- `local`: externalTrafficPolicy Local: kube-proxy's rules, but external traffic goes to local
  pods only and keeps its source address (the fix Kubernetes offers).
- `nftables`, `nft-ct-timeout`: the same Service under `kubeproxy run --proxy-mode nftables`,
  the second with the annotation that gives the Service's UDP flows their own (short) conntrack
  timeout, so SNAT ports are freed sooner: at 5 s the SNAT bound is 64,512 ports / 5 s, about
  12,900 queries/s, instead of about 2,150/s at the kernel's 30 s. The nftables mode masquerades
  `fully-random` (as upstream's does), where the iptables mode's MASQUERADE keeps a client's port
  when it is free; either way a flow holds one of the same 64,512 ports.
- `userspace`: the same Service under `kubeproxy run --proxy-mode userspace` (seeds 003/004's
  proxy): the external IP is redirected to the proxy's own UDP socket, and the proxy sends each
  client's queries to BIND from a relay socket of its own. Nothing is masqueraded, but the
  relay's source ports take SNAT's place: one per client address and port, held until it has
  been idle for --udp-timeout (250 ms), not for the conntrack UDP timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kubeproxy.backends import registry
from kubeproxy.backends.nftables.annotations import UDP_CONNTRACK_TIMEOUT, udp_conntrack_timeout

NFT_CT_TIMEOUT = "5s"

# Bounds of a lab run. The load generator's goal is 20k queries/s on this class of machine;
# beyond 30k we would measure the sender, not the node.
MAX_RATE = 30000.0
MAX_STEP_SECONDS = 600.0
MAX_STEPS = 40
MAX_UDP_TIMEOUT = 3600


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str  # one line for tables and --help
    external_traffic_policy: str = "Cluster"
    manual_dnat: bool = False  # the seed's PREROUTING DNAT rule for the external IP, ahead of kube-proxy's
    proxy_mode: str = "iptables"
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def masquerades_external(self) -> bool:
        """Does the node SNAT the external IP's queries (the seed's problem)? The userspace relay
        does not: it sends from sockets of its own (see the module's docstring)."""
        return self.external_traffic_policy == "Cluster" and not self.manual_dnat and not registry.mode(self.proxy_mode).relays

    @property
    def service_udp_timeout(self) -> int | None:
        """The Service's own UDP conntrack timeout in seconds (the nftables annotation), None for the node's."""
        if not registry.mode(self.proxy_mode).udp_timeout_annotation:
            return None  # a mode that does not read the annotation
        seconds, warning = udp_conntrack_timeout(self.annotations, self.name)
        if warning is not None:
            raise ValueError(f"scenario {self.name}: {warning}")
        return seconds


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("snat", "kube-proxy rules, externalTrafficPolicy Cluster: queries masqueraded to the node IP"),
        Scenario("dnat", "the seed's manual DNAT rule for the external IP, ahead of kube-proxy's: no SNAT", manual_dnat=True),
        Scenario("local", "kube-proxy rules, externalTrafficPolicy Local: no SNAT", external_traffic_policy="Local"),
        Scenario("nftables", "kubeproxy run --proxy-mode nftables, externalTrafficPolicy Cluster", proxy_mode="nftables"),
        Scenario(
            "nft-ct-timeout",
            f"nftables mode, Service annotated {UDP_CONNTRACK_TIMEOUT}: {NFT_CT_TIMEOUT}",
            proxy_mode="nftables",
            annotations={UDP_CONNTRACK_TIMEOUT: NFT_CT_TIMEOUT},
        ),
        Scenario("userspace", "kubeproxy run --proxy-mode userspace: the proxy relays each query itself", proxy_mode="userspace"),
    )
}

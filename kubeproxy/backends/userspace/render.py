"""The userspace mode's iptables rules: redirect each service address to the proxy's own port.

Pure: the node model, the node options and the proxy port of each service port in, restore
text out. Upstream's v1.25 userspace proxier (pkg/proxy/userspace/proxier.go) wrote these
rules one by one with `iptables -A`; we write the same rules, in `iptables-save`'s word order,
as one `iptables-restore --noflush` transaction per sync. Nothing here depends on endpoints:
one redirect per service address, whatever the number of pods behind it.

nat table:
- KUBE-PORTALS-CONTAINER (from PREROUTING: traffic from pods and from other hosts): cluster,
  external and load-balancer IPs `-j REDIRECT --to-ports P`. REDIRECT sends the packet to the
  address of the interface it came in on, which is where a relay bound to the any address
  answers from, so UDP replies leave with the source the client expects. External IPs get a
  second rule for traffic addressed to a local external IP, and the first one only matches
  packets that did not come through a bridge (`-m physdev ! --physdev-is-in`), as upstream.
  REDIRECT needs an address on the incoming interface; where pods hang off unnumbered
  interfaces (Calico's veths), run with `--bind-address NODEIP`: as upstream, the listeners
  then bind that address only and container traffic is DNATed to it instead.
- KUBE-PORTALS-HOST (from OUTPUT: the node's own traffic): `-j DNAT --to-destination NODEIP:P`;
  REDIRECT of local traffic would go to 127.0.0.1 and the replies would come from another
  address.
- KUBE-NODEPORT-CONTAINER / KUBE-NODEPORT-HOST: the same for NodePorts, jumped to last
  (addrtype LOCAL) so a portal always wins over a NodePort on the same port number.
filter table:
- KUBE-NODEPORT-NON-LOCAL (from INPUT): accept new connections to the proxy ports of NodePorts
  despite a default-deny INPUT policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kubeproxy.cluster.addresses import AddressText, ip_text
from kubeproxy.kernel.kernel_text import iptables_comment, word
from kubeproxy.model.node_model import NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions

KUBE_PORTALS_CONTAINER = "KUBE-PORTALS-CONTAINER"
KUBE_PORTALS_HOST = "KUBE-PORTALS-HOST"
KUBE_NODEPORT_CONTAINER = "KUBE-NODEPORT-CONTAINER"
KUBE_NODEPORT_HOST = "KUBE-NODEPORT-HOST"
KUBE_NODEPORT_NON_LOCAL = "KUBE-NODEPORT-NON-LOCAL"

NAT_CHAINS = (KUBE_PORTALS_CONTAINER, KUBE_PORTALS_HOST, KUBE_NODEPORT_CONTAINER, KUBE_NODEPORT_HOST)
FILTER_CHAINS = (KUBE_NODEPORT_NON_LOCAL,)
# Protocols the relay speaks (upstream's userspace proxy refused SCTP too).
PROTOCOLS = ("TCP", "UDP")

_PORTALS_COMMENT = '-m comment --comment "handle ClusterIPs; NOTE: this must be before the NodePort rules"'
_NODEPORTS_COMMENT = (
    '-m addrtype --dst-type LOCAL -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain"'
)
_NON_LOCAL_COMMENT = '-m comment --comment "Ensure that non-local NodePort traffic can flow"'


@dataclass(frozen=True, slots=True)
class Jump:
    """A rule in a built-in chain that sends traffic to one of ours (upstream's iptablesInit)."""

    table: str
    builtin: str
    target: str
    match: str
    prepend: bool  # upstream prepends the portal jumps and appends the NodePort ones

    def args(self) -> str:
        return f"{self.builtin} {self.match} -j {self.target}"


JUMPS = (
    Jump("nat", "PREROUTING", KUBE_PORTALS_CONTAINER, _PORTALS_COMMENT, prepend=True),
    Jump("nat", "OUTPUT", KUBE_PORTALS_HOST, _PORTALS_COMMENT, prepend=True),
    Jump("nat", "PREROUTING", KUBE_NODEPORT_CONTAINER, _NODEPORTS_COMMENT, prepend=False),
    Jump("nat", "OUTPUT", KUBE_NODEPORT_HOST, _NODEPORTS_COMMENT, prepend=False),
    Jump("filter", "INPUT", KUBE_NODEPORT_NON_LOCAL, _NON_LOCAL_COMMENT, prepend=True),
)


@dataclass(frozen=True)
class Rendered:
    text: str
    nat_rules: int
    filter_rules: int
    warnings: tuple[str, ...] = ()


def _cidr(ip: AddressText) -> str:
    """A service address (from a cluster object, so through the address gate) as a /32 or /128."""
    return f"{ip}/128" if ":" in ip else f"{ip}/32"


def _host_port(node_ip: str, port: int) -> str:
    """Where the node's own traffic is sent: the node's address (--bind-address, --node-ip or its
    Node's, each checked where it is read), never a Service's."""
    return f"[{node_ip}]:{port}" if ":" in node_ip else f"{node_ip}:{port}"


def _common(name: ServicePortName, protocol: str, port: int, dest: AddressText | None) -> str:
    """The match upstream's iptablesCommonPortalArgs builds, as iptables-save prints it."""
    proto = protocol.lower()
    comment = iptables_comment(word(str(name)))
    dst = f"-d {_cidr(dest)} " if dest else ""
    return f'{dst}-p {proto} -m comment --comment "{comment}" -m {proto} --dport {port}'


def _redirect(proxy_port: int) -> str:
    return f"-j REDIRECT --to-ports {proxy_port}"


def _dnat(node_ip: str, proxy_port: int) -> str:
    return f"-j DNAT --to-destination {_host_port(node_ip, proxy_port)}"


def service_rules(svc: ServicePortInfo, proxy_port: int, node_ip: str, listen_ip: str = "") -> dict[str, list[str]]:
    """The rules of one service port, by chain (without `-A CHAIN`).

    `listen_ip` "" means the listeners are bound to the any address (upstream's listenIP 0.0.0.0).
    """
    to_relay = _dnat(listen_ip, proxy_port) if listen_ip else _redirect(proxy_port)
    node_ip = listen_ip or node_ip
    out: dict[str, list[str]] = {chain: [] for chain in (*NAT_CHAINS, *FILTER_CHAINS)}
    name, proto = svc.name, svc.protocol
    container, host = out[KUBE_PORTALS_CONTAINER], out[KUBE_PORTALS_HOST]
    # Cluster IP and load-balancer IPs: "not external" portals in upstream's words.
    for ip in (ip_text(svc.cluster_ip), *map(ip_text, svc.load_balancer_vips)):
        container.append(f"{_common(name, proto, svc.port, ip)} {to_relay}")
        if node_ip:
            host.append(f"{_common(name, proto, svc.port, ip)} {_dnat(node_ip, proxy_port)}")
    for ip in map(ip_text, svc.external_ips):
        common = _common(name, proto, svc.port, ip)
        container.append(f"{common} -m physdev ! --physdev-is-in {to_relay}")
        container.append(f"{common} -m addrtype --dst-type LOCAL {to_relay}")
        if node_ip:
            host.append(f"{common} -m addrtype --dst-type LOCAL {_dnat(node_ip, proxy_port)}")
    if svc.node_port:
        common = _common(name, proto, svc.node_port, None)
        out[KUBE_NODEPORT_CONTAINER].append(f"{common} {to_relay}")
        if node_ip:
            out[KUBE_NODEPORT_HOST].append(f"{common} {_dnat(node_ip, proxy_port)}")
        # Upstream matches the proxy port here: after REDIRECT, INPUT sees the new port.
        out[KUBE_NODEPORT_NON_LOCAL].append(f"{_common(name, proto, proxy_port, None)} -m state --state NEW -j ACCEPT")
    return out


def render(view: NodeView, opts: NodeOptions, proxy_ports: Mapping[ServicePortName, int], listen_ip: str = "") -> Rendered:
    """Every rule of the mode, for the service ports that have a proxy port.

    Declaring our chains in a `--noflush` restore flushes them, so the text is a full sync
    of our five chains and leaves every other chain alone.
    """
    chains: dict[str, list[str]] = {chain: [] for chain in (*NAT_CHAINS, *FILTER_CHAINS)}
    warnings: list[str] = []
    if not opts.node_ip and not listen_ip:
        warnings.append("no node IP (--node-ip or the Node object): traffic from the node itself is not redirected")
    for name in sorted(view.services):
        port = proxy_ports.get(name)
        if port is None:
            continue
        for chain, rules in service_rules(view.services[name], port, opts.node_ip, listen_ip).items():
            chains[chain].extend(rules)
    lines = ["*nat", *(f":{c} - [0:0]" for c in NAT_CHAINS)]
    lines += [f"-A {c} {rule}" for c in NAT_CHAINS for rule in chains[c]]
    lines += ["COMMIT", "*filter", *(f":{c} - [0:0]" for c in FILTER_CHAINS)]
    lines += [f"-A {c} {rule}" for c in FILTER_CHAINS for rule in chains[c]]
    lines += ["COMMIT", ""]
    return Rendered(
        "\n".join(lines),
        nat_rules=sum(len(chains[c]) for c in NAT_CHAINS),
        filter_rules=sum(len(chains[c]) for c in FILTER_CHAINS),
        warnings=tuple(warnings),
    )


def with_jumps(text: str) -> str:
    """`text` with the jumps from the built-in chains, for a self-contained rule set
    (`kubeproxy render --with-jumps`, a fresh namespace). The live proxy ensures them with
    `iptables -C`/`-I`/`-A` instead, leaving the rest of the built-in chains where they are."""
    out: list[str] = []
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line == "COMMIT":
            out.extend(f"-A {j.args()}" for j in JUMPS if j.table == table)
        out.append(line)
    return "\n".join(out) + "\n"

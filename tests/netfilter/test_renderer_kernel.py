"""Our iptables renderer's output, traced and compared with the kernel (render -> restore -> probe).

The renderer writes KUBE-* chains only; the jumps from the built-in chains are added here the
way upstream's proxier adds them (`iptables -I`), for the chains the rendering holds.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kubeproxy.netfilter import iptables_save
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import trace
from tests.netfilter.kernel_bed import assert_kernel_agrees, bed

pytestmark = pytest.mark.root
DEMO = Path(__file__).parents[2] / "kubeproxy" / "examples" / "demo.yaml"

# upstream's iptablesJumpChains, in its order
JUMPS = [
    ("filter", "INPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\"",
     "KUBE-PROXY-FIREWALL"),
    ("filter", "INPUT", "-m comment --comment \"kubernetes health check service ports\"", "KUBE-NODEPORTS"),
    ("filter", "INPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible "
     "service portals\"", "KUBE-EXTERNAL-SERVICES"),
    ("filter", "INPUT", "", "KUBE-FIREWALL"),
    ("filter", "FORWARD", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\"",
     "KUBE-PROXY-FIREWALL"),
    ("filter", "FORWARD", "-m comment --comment \"kubernetes forwarding rules\"", "KUBE-FORWARD"),
    ("filter", "FORWARD", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\"",
     "KUBE-SERVICES"),
    ("filter", "FORWARD", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible "
     "service portals\"", "KUBE-EXTERNAL-SERVICES"),
    ("filter", "OUTPUT", "-m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\"",
     "KUBE-SERVICES"),
    ("filter", "OUTPUT", "", "KUBE-FIREWALL"),
    ("nat", "OUTPUT", "-m comment --comment \"kubernetes service portals\"", "KUBE-SERVICES"),
    ("nat", "PREROUTING", "-m comment --comment \"kubernetes service portals\"", "KUBE-SERVICES"),
    ("nat", "POSTROUTING", "-m comment --comment \"kubernetes postrouting rules\"", "KUBE-POSTROUTING"),
]


def _rendered() -> str:
    render = pytest.importorskip("kubeproxy.render")
    from kubeproxy.proxy.config import ProxyConfig

    loaded = render.load([str(DEMO)])
    text = render.render_iptables(
        loaded.state, ProxyConfig(cluster_cidr=("10.244.0.0/16",)), nfacct_counters=()
    ).rendered.text
    out: list[str] = []
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        if line == "COMMIT":
            declared = set(re.findall(r"^:(\S+)", "\n".join(out), re.M))
            for t, base, match, chain in JUMPS:
                if t == table and chain in declared:
                    out.append(f"-A {base} {match} -j {chain}".replace("  ", " "))
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(
    ("proto", "dst", "count"),
    [("tcp", "10.96.10.10:80", 300), ("tcp", "10.96.40.40:80", 5), ("udp", "10.96.0.53:53", 20)],
    ids=["web-two-endpoints", "gone-no-endpoints-reject", "dns-udp"],
)
def test_rendered_services_behave_as_traced(proto: str, dst: str, count: int) -> None:
    text = _rendered()
    rs = iptables_save.parse(text)
    with bed("172.16.0.2/24", ("eth0", "172.16.0.1/24"), ("eth1", "10.244.0.1/16"),
             ["10.244.1.10/16", "10.244.2.10/16", "10.244.1.3/16"]) as b:
        b.node.run(["iptables-restore", "--noflush"], input=text)
        b.serve(b.backend, "tcp", ["10.244.1.10:8080", "10.244.2.10:8080"])
        b.serve(b.backend, "udp", ["10.244.1.3:53"])
        res = trace(rs, b.model, make_packet(proto, b.client_ip, dst, in_iface="eth0"))
        observed = b.send(proto, dst, count, timeout=0.5)
    assert_kernel_agrees(res.outcomes, observed)

"""Our iptables renderer's output, traced and compared with the kernel (render -> restore -> probe).

The renderer writes KUBE-* chains only; upstream's jumps from the built-in chains are added
with backends.iptables.jumps, as a node ends up with them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.cluster.manifest_load import load
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.netfilter import iptables_save
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.simulate import trace
from tests.netfilter.kernel_bed import assert_kernel_agrees, bed

pytestmark = pytest.mark.root
DEMO = Path(__file__).parents[2] / "kubeproxy" / "examples" / "demo.yaml"

def _rendered() -> str:
    loaded = load([str(DEMO)])
    text = render_iptables(
        loaded.state, ProxyConfig(cluster_cidr=("10.244.0.0/16",)), nfacct_counters=()
    ).rendered.text
    return with_jumps(text)


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

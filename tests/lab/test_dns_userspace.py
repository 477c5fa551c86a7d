"""The DNS lab's `userspace` scenario: BIND behind the userspace relay (as root)."""

from __future__ import annotations

import pytest

from kubeproxy.lab.cluster import NODE_IP
from kubeproxy.lab.dns.scenarios import SCENARIOS
from kubeproxy.lab.dns.world import EXTERNAL_IP, DnsWorld


@pytest.mark.root
def test_the_relay_answers_for_bind_without_masquerading() -> None:
    with DnsWorld.build(SCENARIOS["userspace"], udp_timeout=45) as world:
        assert world.answers(EXTERNAL_IP)
        assert world.masquerade_rule() is None  # no kernel SNAT: the relay sends from its own sockets
        pod = world.pod_ips[0]
        out = world.node.run(["conntrack", "-L", "-p", "udp", "--orig-dst", pod], check=False).stdout
        sources = {f.removeprefix("src=") for line in out.splitlines() for f in line.split()[:6] if f.startswith("src=")}
        assert sources == {NODE_IP}, out  # BIND sees the relay on the node, never the resolvers

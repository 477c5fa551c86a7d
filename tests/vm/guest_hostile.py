"""Hostile addresses against a live IPVS node in the VM: nothing of them reaches the kernel.

Run by guest_e2e.py in its ipvs bed (the host's kernel has no IPVS; iptables, ip6tables and
nftables are tests/e2e/test_hostile_addresses_kernel.py's, on the host). The proxy is the bed's
`kubeproxy run --manifests`; the hostile objects are that test's: the zone injection
(`fd00::99%1` followed by restore commands) as an externalIP, an endpoint address and an
address of the node's own Node, and endpoint addresses and externalIPs that are unspecified,
loopback, link-local or link-local multicast. Each must be one warning naming its object and
field, and the node's whole IPVS-mode state afterwards (`ipvsadm-save -n`, `ipset save`, the
addresses of kube-ipvs0, iptables-save, ip6tables-save) exactly the state of the world without
them, while an ordinary Service keeps answering the client through its ClusterIP, external IP
and NodePort.

An IPVS sync is not atomic (ipset, kube-ipvs0, iptables, then ipvsadm, each line by line), so a
change's rules being visible does not say its sync is over. A canary Service is the fence: it
leaves in the change that brings the hostile objects and comes back in the next one; once its
real server is in the IPVS table again, the sync that saw the hostile objects has finished,
whatever it did: a sync programs the node's families one after the other, and the next sync
starts after the last of them (live.py), so the IPv6 lane's part of it is over too.
"""

from __future__ import annotations

import os
import re

import yaml

from kubeproxy.lab.builders import JSON, Port, endpoint_slice, service
from kubeproxy.lab.cluster import HEALTHZ_BIND, NODE_IP, NODE_NAME, MiniCluster
from tests.e2e.scenarios import NODE_PORT, Load

WEB = Port("p", 80, 8080, node_port=NODE_PORT)  # the port the hostile EndpointSlices of "web" name
WEB_IP = "10.96.0.80"
WEB_EXTERNAL_IP = "203.0.113.70"  # in EXTERNAL_CIDRS: the client routes it to the node
CANARY = Port("canary", 86, 8080)
CANARY_IP = "10.96.0.90"
HOSTILE_FILE = "hostile.yaml"
# Each tool's view of the node, as the proxy leaves it in ipvs mode.
DUMPS: dict[str, list[str]] = {
    "ipvsadm-save": ["ipvsadm-save", "-n"],
    "ipset": ["ipset", "save"],
    "kube-ipvs0": ["ip", "-o", "addr", "show", "dev", "kube-ipvs0"],
    "iptables-save": ["iptables-save"],
    "ip6tables-save": ["ip6tables-save"],
}
# Read line by line in any order: the kernel lists IPVS services, set entries and a device's
# addresses in its own (hash or insertion) order, and each line is whole by itself.
UNORDERED = frozenset({"ipvsadm-save", "ipset", "kube-ipvs0"})


def world(c: MiniCluster) -> list[JSON]:
    return [service("web", WEB_IP, [WEB], type="NodePort", external_ips=[WEB_EXTERNAL_IP]),
            endpoint_slice("web", c.backends("a"), [WEB])]  # fmt: skip


def canary(c: MiniCluster) -> list[JSON]:
    return [service("canary", CANARY_IP, [CANARY]), endpoint_slice("canary", c.backends("b"), [CANARY])]


def kernel_state(c: MiniCluster) -> dict[str, str]:
    """Every dump of DUMPS, without counters and comments (traffic and time change those)."""
    out = {}
    for name, argv in DUMPS.items():
        lines = [line for line in c.node.run(argv).stdout.splitlines() if not line.startswith("#")]
        lines = [re.sub(r"\[\d+:\d+\]", "[]", line) for line in lines]
        out[name] = "\n".join(sorted(lines) if name in UNORDERED else lines)
    return out


def answers(c: MiniCluster) -> dict[str, object]:
    """One new TCP connection from the client to each of web's addresses: where it arrived."""
    dsts = [f"{WEB_IP}:{WEB.port}", f"{WEB_EXTERNAL_IP}:{WEB.port}", f"{NODE_IP}:{NODE_PORT}"]
    got = c.sweep("tcp", c.client, dsts, timeout=10.0)
    return {dst: r["dst"] if isinstance(r, dict) else r for dst, r in got.items()}


def write_hostile(c: MiniCluster, objs: list[JSON]) -> None:
    """The hostile objects in a manifest file of their own, written whole. Not through
    `write_manifests`: the bed's rule waits parse every Service it wrote, and these refuse parsing."""
    path = c.manifests / HOSTILE_FILE
    tmp = path.with_name(f".{HOSTILE_FILE}.tmp")
    tmp.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    os.replace(tmp, path)


def fenced(c: MiniCluster, node: JSON, timeout: float) -> dict[str, str]:
    """The canary out with `node` and the world, then back in: the kernel state once that sync is over."""
    c.write_manifests([node, *world(c)])
    c.wait_rules("the canary's virtual server gone", lambda rules: not rules.mentions("default/canary"), timeout)
    objs = [*world(c), *canary(c)]
    c.write_manifests([node, *objs])
    c.wait_applied(objs, timeout)
    return kernel_state(c)


def hostile_addresses(c: MiniCluster, load: Load, timeout: float) -> None:
    # Imported here: the hostile objects' module brings the live proxy and the API server test
    # harness with it, seconds of imports under TCG that only this scenario needs.
    from tests.e2e.test_hostile_addresses_kernel import INJECTION, foreign_text, hostile

    wanted = {f"{WEB_IP}:{WEB.port}", f"{WEB_EXTERNAL_IP}:{WEB.port}", f"{NODE_IP}:{NODE_PORT}"}
    at_a = f"{c.pods['a'].ip}:{WEB.target}"
    load([*world(c), *canary(c)])
    try:
        reference = fenced(c, c.node_object(), timeout)  # reached as the hostile round's state is
        for name, text in reference.items():
            assert foreign_text(text) == [], (name, foreign_text(text))  # "the same as before" means "none of it"
        assert all(WEB_IP in text for name, text in reference.items() if name in UNORDERED), reference  # it shows the world
        before = answers(c)
        assert before == dict.fromkeys(wanted, at_a), before

        objs, expected = hostile()
        injected_node = c.node_object()
        # its third address: status.addresses[2], after the InternalIP and the Hostname
        injected_node["status"]["addresses"].append({"type": "InternalIP", "address": INJECTION})
        expected.append(("Node", NODE_NAME, "status.addresses[2].address"))
        logged = len(c.proxy_log())
        write_hostile(c, objs)  # before the canary leaves: the sync without the canary has seen them
        after = fenced(c, injected_node, timeout)

        lines = c.proxy_log()[logged:].splitlines()
        for kind, ref, field in expected:
            naming = [line for line in lines if f"{kind} {ref}:" in line and field in line]
            assert len(naming) == 1, (kind, ref, field, naming, lines[-30:])
        assert not [line for line in lines if "Traceback" in line or "failed to sync" in line.lower()], lines[-30:]
        for name, text in after.items():
            assert foreign_text(text) == [], (name, foreign_text(text))
            assert text == reference[name], (name, text, reference[name])  # nothing added, nothing lost
        now = answers(c)
        assert now == dict.fromkeys(wanted, at_a), now
        health = c.http_get(c.node, f"http://127.0.0.1:{HEALTHZ_BIND.rsplit(':', 1)[1]}/healthz")
        assert health.status == 200, health.body
        assert c.proxy is not None and c.proxy.poll() is None
    finally:
        (c.manifests / HOSTILE_FILE).unlink(missing_ok=True)

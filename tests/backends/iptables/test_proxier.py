"""The iptables backend's sync: jumps, partial syncs, the canary, stale chains, cleanup.

Every scenario runs twice: on the package's `FakeIptables` (no root, milliseconds) and in a real
kernel in a namespace (root), which keeps the fake honest.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from kubeproxy.backends.iptables import jumps
from kubeproxy.backends.iptables import render as iptables_render
from kubeproxy.backends.iptables.apply import RestoreError, ensure_nfacct_counters
from kubeproxy.backends.iptables.fake import FakeIptables
from kubeproxy.backends.iptables.offline import NodeRendering, render_iptables
from kubeproxy.backends.iptables.proxier import IptablesProxier
from kubeproxy.cluster.manifest_load import load
from kubeproxy.lab.netns import NetNS
from kubeproxy.model.contract import FULL_SYNC_PERIOD
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import NFACCT_COUNTERS, Family
from kubeproxy.model.proxy_config import ProxyConfig
from tests.paths import DEMO

CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16",))

# Rules and chains someone else owns: a sync must keep them, cleanup must leave them.
FOREIGN = """*nat
:OTHER-DNAT - [0:0]
:KUBE-MARK-DROP - [0:0]
-A PREROUTING -d 192.0.2.1/32 -j OTHER-DNAT
-A OTHER-DNAT -p udp -j DNAT --to-destination 10.9.9.9:53
COMMIT
*filter
:OTHER-FILTER - [0:0]
-A INPUT -j OTHER-FILTER
-A OTHER-FILTER -s 198.51.100.0/24 -j DROP
COMMIT
"""


def _demo(counters: set[str]) -> NodeRendering:
    loaded = load([DEMO])
    return render_iptables(loaded.state, CFG, nfacct_counters=counters)


def _save(ns: Namespace) -> str:
    return "\n".join(line for line in ns.run(["iptables-save"]).stdout.splitlines() if not line.startswith("#"))


def _rules(ns: Namespace, table: str, chain: str) -> list[str]:
    return ns.run(["iptables", "-w", "-t", table, "-S", chain]).stdout.splitlines()[1:]


def _drop_service(view: NodeView, namespace: str, name: str) -> NodeView:
    keep = {k: v for k, v in view.services.items() if k.service != (namespace, name)}
    return NodeView(keep, {k: v for k, v in view.endpoints.items() if k in keep})


@dataclasses.dataclass
class FakeNamespace:
    """What the tests use of a namespace (`run`), backed by the fake."""

    fake: FakeIptables = dataclasses.field(default_factory=FakeIptables)

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.fake.run(argv, **kwargs)


Namespace = NetNS | FakeNamespace
ProxierNode = tuple[Namespace, IptablesProxier, NodeRendering]  # the namespace, its proxier, the demo


@pytest.fixture(params=["fake", pytest.param("kernel", marks=pytest.mark.root)])
def node(request: pytest.FixtureRequest) -> ProxierNode:
    ns: Namespace = request.getfixturevalue("netns") if request.param == "kernel" else FakeNamespace()
    ns.run(["iptables-restore", "--noflush"], input=FOREIGN)
    counters = ensure_nfacct_counters(NFACCT_COUNTERS, ns.run)
    proxier = IptablesProxier(run=ns.run)
    proxier.ensure_canary()
    return ns, proxier, _demo(counters)


def test_full_sync_adds_each_jump_once_and_keeps_foreign_rules(node: ProxierNode) -> None:
    ns, proxier, demo = node
    first = proxier.sync(demo.view, demo.options, None)
    assert first.full and first.jumps_added == len(jumps.ENSURE_ORDER)
    again = proxier.sync(demo.view, demo.options, None)
    assert again.jumps_added == 0
    # Prepended in upstream's order, ahead of the rules that were there, each exactly once.
    for table, builtin in (("nat", "PREROUTING"), ("nat", "OUTPUT"), ("filter", "INPUT"), ("filter", "FORWARD")):
        expected = [jumps.rule(j) for j in jumps.node_order() if (j.table, j.builtin) == (table, builtin)]
        assert _rules(ns, table, builtin)[: len(expected)] == expected
    assert _rules(ns, "nat", "PREROUTING")[-1] == "-A PREROUTING -d 192.0.2.1/32 -j OTHER-DNAT"
    assert _rules(ns, "filter", "INPUT")[-1] == "-A INPUT -j OTHER-FILTER"
    assert _rules(ns, "filter", "OTHER-FILTER") == ["-A OTHER-FILTER -s 198.51.100.0/24 -j DROP"]


def test_kubelets_firewall_chain_and_jumps_in_ipv6_too(node: ProxierNode) -> None:
    """Upstream ensures KUBE-FIREWALL and its INPUT/OUTPUT jumps in every family before a full
    sync (iptablesKubeletJumpChains), though only IPv4 with localhost NodePorts fills it; a rule
    someone else put in it stays."""
    ns, _, _ = node
    loaded = load([DEMO])
    v6 = render_iptables(loaded.state, CFG, nfacct_counters=(), family=Family.IPV6)
    ns.run(["ip6tables", "-w", "-t", "filter", "-N", "KUBE-FIREWALL"])
    ns.run(["ip6tables", "-w", "-t", "filter", "-A", "KUBE-FIREWALL", "-s", "2001:db8::1/128", "-j", "DROP"])
    proxier = IptablesProxier(family=Family.IPV6, run=ns.run)
    proxier.ensure_canary()
    report = proxier.sync(v6.view, v6.options, None)
    assert report.full and report.jumps_added == len(jumps.ENSURE_ORDER)
    saved = ns.run(["ip6tables-save", "-t", "filter"]).stdout
    assert "-A INPUT -j KUBE-FIREWALL" in saved and "-A OUTPUT -j KUBE-FIREWALL" in saved
    assert "-A KUBE-FIREWALL -s 2001:db8::1/128 -j DROP" in saved
    assert proxier.sync(v6.view, v6.options, None).jumps_added == 0


def test_kubelets_firewall_chain_is_created_when_missing(node: ProxierNode) -> None:
    ns, _, _ = node
    loaded = load([DEMO])
    v6 = render_iptables(loaded.state, CFG, nfacct_counters=(), family=Family.IPV6)
    proxier = IptablesProxier(family=Family.IPV6, run=ns.run)
    proxier.ensure_canary()
    proxier.sync(v6.view, v6.options, None)
    saved = ns.run(["ip6tables-save", "-t", "filter"]).stdout
    assert ":KUBE-FIREWALL - [0:0]" in saved and "-A INPUT -j KUBE-FIREWALL" in saved


def test_partial_sync_rewrites_only_changed_services(node: ProxierNode) -> None:
    ns, proxier, demo = node
    proxier.sync(demo.view, demo.options, None)
    # Someone edits a service chain behind our back; a partial sync for another service keeps
    # the edit (the chain is not rewritten), a sync that names the service repairs it.
    web = next(n for n in demo.view.services if n.service == ("default", "web"))
    from kubeproxy.backends.iptables import names

    chain = names.service_chain(str(web), web.protocol.lower())
    ns.run(["iptables", "-w", "-t", "nat", "-A", chain, "-j", "RETURN"])
    report = proxier.sync(demo.view, demo.options, frozenset({("dns", "bind")}))
    assert not report.full and report.rendered.skipped_nat_rules > 0
    assert _rules(ns, "nat", chain)[-1] == f"-A {chain} -j RETURN"
    proxier.sync(demo.view, demo.options, frozenset({("default", "web")}))
    assert f"-A {chain} -j RETURN" not in _rules(ns, "nat", chain)


def test_flushed_tables_bring_a_full_sync_through_the_canary(node: ProxierNode) -> None:
    ns, proxier, demo = node
    proxier.sync(demo.view, demo.options, None)
    before = _save(ns)
    # A firewall reload: everything flushed and deleted, ours and the canary alike.
    for table in ("nat", "filter", "mangle"):
        ns.run(["iptables", "-w", "-t", table, "-F"])
        ns.run(["iptables", "-w", "-t", table, "-X"])
    assert not proxier.canary_present()
    ns.run(["iptables-restore", "--noflush"], input=FOREIGN)
    report = proxier.sync(demo.view, demo.options, frozenset())  # asked for a no-op partial sync
    assert report.full and proxier.canary_present()
    assert sorted(_save(ns).splitlines()) == sorted(before.splitlines())


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
def test_a_sync_an_hour_after_the_last_full_one_is_full_unless_the_cluster_is_large(
    node: ProxierNode, large: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Upstream's iptables proxier: doFullSync once time.Since(lastFullSync) > FullSyncPeriod,
    # except in large-cluster mode (over 1,000 endpoints; here the threshold is lowered).
    _ns, proxier, demo = node
    if large:
        monkeypatch.setattr(iptables_render, "LARGE_CLUSTER_ENDPOINTS", 0)
    now = [0.0]
    proxier.clock = lambda: now[0]
    assert proxier.sync(demo.view, demo.options, None).full
    now[0] = FULL_SYNC_PERIOD
    assert not proxier.sync(demo.view, demo.options, frozenset()).full
    now[0] = FULL_SYNC_PERIOD + 0.5
    assert proxier.sync(demo.view, demo.options, frozenset()).full is not large
    now[0] = 2 * FULL_SYNC_PERIOD
    assert not proxier.sync(demo.view, demo.options, frozenset({("default", "web")})).full


def test_removed_service_chains_are_deleted(node: ProxierNode) -> None:
    ns, proxier, demo = node
    proxier.sync(demo.view, demo.options, None)
    smaller = _drop_service(demo.view, "default", "session")
    report = proxier.sync(smaller, demo.options, frozenset({("default", "session")}))
    assert report.rendered.deleted_chains
    nat = ns.run(["iptables-save", "-t", "nat"]).stdout
    for chain in report.rendered.deleted_chains:
        assert f":{chain} " not in nat


def test_failed_restore_raises_and_leaves_the_rules(node: ProxierNode) -> None:
    ns, proxier, demo = node
    proxier.sync(demo.view, demo.options, None)
    before = _save(ns)
    broken = dataclasses.replace(demo.options, masquerade_mark="not-a-mark")
    with pytest.raises(RestoreError):
        proxier.sync(demo.view, broken, None)
    assert _save(ns) == before


def test_cleanup_removes_ours_and_nothing_else(node: ProxierNode) -> None:
    ns, proxier, demo = node
    pristine = _save(ns)
    proxier.sync(demo.view, demo.options, None)
    removed = proxier.cleanup()
    assert any("KUBE-SERVICES" in r for r in removed)
    after = _save(ns)
    assert "KUBE-" not in after.replace("KUBE-MARK-DROP", "")
    assert sorted(line for line in after.splitlines() if "CANARY" not in line) == sorted(
        line for line in pristine.splitlines() if "CANARY" not in line
    )


def test_cleanup_keeps_shared_chain_someone_else_uses(node: ProxierNode) -> None:
    ns, proxier, demo = node
    proxier.sync(demo.view, demo.options, None)
    # kubelet-style hostport rule using KUBE-MARK-MASQ
    ns.run(["iptables", "-w", "-t", "nat", "-A", "OTHER-DNAT", "-s", "10.0.0.0/8", "-j", "KUBE-MARK-MASQ"])
    proxier.cleanup()
    assert _rules(ns, "nat", "KUBE-MARK-MASQ") == ["-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"]


def _structure(ns: Namespace) -> dict[str, dict[str, list[str]]]:
    """Per table and chain, the targets of its rules in order: what the kernel keeps of our text
    whatever order iptables-save prints the matches in."""
    out: dict[str, dict[str, list[str]]] = {}
    for table in ("nat", "filter"):
        chains: dict[str, list[str]] = {}
        for line in ns.run(["iptables-save", "-t", table]).stdout.splitlines():
            if line.startswith(":"):
                chains[line[1:].split()[0]] = []
            elif line.startswith("-A "):
                parts = line.split()
                chains[parts[1]].append(parts[parts.index("-j") + 1] if "-j" in parts else "")
        out[table] = chains
    return out


@pytest.mark.root
def test_the_fake_and_the_kernel_end_in_the_same_tables(netns: NetNS) -> None:
    """The same syncs on both end with the same chains, each with the same rules (by target) in order."""
    fake = FakeNamespace()
    seen = []
    for ns in (fake, netns):
        ns.run(["iptables-restore", "--noflush"], input=FOREIGN)
        demo = _demo(ensure_nfacct_counters(NFACCT_COUNTERS, ns.run))
        proxier = IptablesProxier(run=ns.run)
        proxier.ensure_canary()
        proxier.sync(demo.view, demo.options, None)
        proxier.sync(_drop_service(demo.view, "default", "session"), demo.options, frozenset({("default", "session")}))
        seen.append(_structure(ns))
    assert seen[0] == seen[1]
    assert len(seen[0]["nat"]) > 20  # the demo's chains, not two empty tables

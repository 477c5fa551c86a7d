"""Partial syncs that leave unchanged shared chains out end with the kernel a full sync would leave.

`AppliedChains` (backends/iptables/last_restore.py) drops from a partial restore the shared chains
(KUBE-SERVICES, KUBE-NODEPORTS, the filter chains...) whose text is what our last successful
restore wrote. A sequence of partial syncs is run on the fake and on the kernel (both iptables
variants, in a namespace), and after each step the tables are compared with those of a fresh
node that had one full sync of the same view.
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.iptables.apply import RestoreError, ensure_nfacct_counters
from kubeproxy.backends.iptables.fake import FakeIptables
from kubeproxy.backends.iptables.last_restore import AppliedChains
from kubeproxy.backends.iptables.offline import NodeRendering, render_iptables
from kubeproxy.backends.iptables.proxier import IptablesProxier
from kubeproxy.cluster.manifest_load import load
from kubeproxy.kernel.exec import Runner
from kubeproxy.lab import netns as netns_mod
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import NFACCT_COUNTERS
from kubeproxy.model.proxy_config import ProxyConfig

DEMO = Path(__file__).parents[3] / "kubeproxy" / "examples" / "demo.yaml"
CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16",))
# Rules someone else owns: they must survive every sync.
FOREIGN = """*nat
:OTHER-DNAT - [0:0]
-A PREROUTING -d 192.0.2.1/32 -j OTHER-DNAT
-A OTHER-DNAT -p udp -j DNAT --to-destination 10.9.9.9:53
COMMIT
*filter
:OTHER-FILTER - [0:0]
-A INPUT -j OTHER-FILTER
-A OTHER-FILTER -s 198.51.100.0/24 -j DROP
COMMIT
"""


@dataclasses.dataclass
class FakeNamespace:
    fake: FakeIptables = dataclasses.field(default_factory=FakeIptables)

    def run(self, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.fake.run(argv, **kwargs)


def _demo(counters: set[str]) -> NodeRendering:
    return render_iptables(load([DEMO]).state, CFG, nfacct_counters=counters)


def _drop_service(view: NodeView, namespace: str, name: str) -> NodeView:
    keep = {k: v for k, v in view.services.items() if k.service != (namespace, name)}
    return NodeView(keep, {k: v for k, v in view.endpoints.items() if k in keep})

WEB, SESSION = ("default", "web"), ("default", "session")


def _fewer_endpoints(view: NodeView, service: tuple[str, str]) -> NodeView:
    """`service` with its first endpoint gone (its own chains change, KUBE-SERVICES does not)."""
    eps = {k: (v[1:] if k.service == service else v) for k, v in view.endpoints.items()}
    return NodeView(dict(view.services), eps)


def _tables(run: Runner, variant: str) -> dict[str, dict[str, list[str]]]:
    """Per table, each chain's rules in order (iptables-save, counters and comments dropped)."""
    out: dict[str, dict[str, list[str]]] = {}
    for table in ("nat", "filter"):
        chains: dict[str, list[str]] = {}
        for line in run([f"iptables-{variant}-save" if variant else "iptables-save", "-t", table]).stdout.splitlines():
            if line.startswith(":"):
                chains[line[1:].split()[0]] = []
            elif line.startswith("-A "):
                chains[line.split()[1]].append(line)
        out[table] = chains
    return out


def _steps(view: NodeView) -> list[tuple[str, NodeView, frozenset[tuple[str, str]]]]:
    fewer = _fewer_endpoints(view, WEB)
    without = _drop_service(fewer, *SESSION)
    return [
        ("endpoint gone", fewer, frozenset({WEB})),
        ("service gone", without, frozenset({SESSION})),
        ("nothing changed", without, frozenset()),
        ("both back", view, frozenset({WEB, SESSION})),
    ]


def _run_sequence(make_node: Callable[[], Runner], variant: str) -> None:
    run = make_node()
    counters = ensure_nfacct_counters(NFACCT_COUNTERS, run)
    demo = _demo(counters)
    proxier = IptablesProxier(run=run, variant=variant)
    proxier.ensure_canary()
    first = proxier.sync(demo.view, demo.options, None)
    assert first.skipped_chains == ()
    skipped_any = False
    for label, view, changed in _steps(demo.view):
        report = proxier.sync(view, demo.options, changed)
        skipped_any |= bool(report.skipped_chains)
        if label == "endpoint gone":
            assert "nat/KUBE-SERVICES" in report.skipped_chains
        if label == "service gone":
            assert "nat/KUBE-SERVICES" not in report.skipped_chains  # its entry went: rewritten
        reference = make_node()
        ref_proxier = IptablesProxier(run=reference, variant=variant)
        ref_proxier.ensure_canary()
        ref_proxier.sync(view, demo.options, None)
        assert _tables(run, variant) == _tables(reference, variant), label
    assert skipped_any


def test_partial_syncs_equal_a_full_render_on_the_fake() -> None:
    def make() -> Runner:
        node = FakeNamespace()
        node.run(["iptables-restore", "--noflush"], input=FOREIGN)
        return node.run

    _run_sequence(make, "")


@pytest.mark.root
@pytest.mark.parametrize("variant", ["legacy", "nft"])
def test_partial_syncs_equal_a_full_render_in_the_kernel(variant: str) -> None:
    with netns_mod.netns("kpac") as ns, netns_mod.netns("kpacref") as ref_ns:
        pool = iter([ns, ref_ns])
        made: list[netns_mod.NetNS] = []

        def make() -> Runner:
            # The first call is the node under test; every later one a reference node, reset.
            node = next(pool, None) or made[-1]
            if node is ref_ns and made.count(ref_ns):
                for table in ("nat", "filter", "mangle"):
                    node.run([f"iptables-{variant}", "-w", "-t", table, "-F"])
                    node.run([f"iptables-{variant}", "-w", "-t", table, "-X"])
            made.append(node)
            ensure_nfacct_counters(NFACCT_COUNTERS, node.run)  # the demo's rules count with them
            node.run([f"iptables-{variant}-restore", "--noflush"], input=FOREIGN)
            return node.run

        _run_sequence(make, variant)


def test_a_failed_restore_makes_the_next_partial_sync_write_everything() -> None:
    node = FakeNamespace()
    restores: list[str] = []
    fail = [False]

    def run(argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        if argv[0].endswith("-restore"):
            restores.append(kwargs.get("input") or "")
            if fail[0]:
                fail[0] = False
                return subprocess.CompletedProcess(argv, 1, "", "refused")
        return node.run(argv, **kwargs)

    demo = _demo(ensure_nfacct_counters(NFACCT_COUNTERS, run))
    proxier = IptablesProxier(run=run)
    proxier.ensure_canary()
    proxier.sync(demo.view, demo.options, None)
    assert proxier.sync(demo.view, demo.options, frozenset({WEB})).skipped_chains
    assert ":KUBE-SERVICES - [0:0]" not in restores[-1]
    fail[0] = True
    with pytest.raises(RestoreError):
        proxier.sync(demo.view, demo.options, frozenset({WEB}))
    again = proxier.sync(demo.view, demo.options, frozenset({WEB}))
    assert again.skipped_chains == ()
    assert ":KUBE-SERVICES - [0:0]" in restores[-1]


def test_only_shared_chains_declared_in_the_text_are_left_out() -> None:
    applied = AppliedChains()
    svc = "KUBE-SVC-AAAAAAAAAAAAAAAA"
    text = f"*nat\n:KUBE-SERVICES - [0:0]\n:{svc} - [0:0]\n-A KUBE-SERVICES -j {svc}\n-A {svc} -j RETURN\nCOMMIT\n"
    first = applied.filter(text, full=True)
    assert first.text == text and first.skipped == ()
    applied.applied(first, full=True)
    again = applied.filter(text, full=False)
    # The service chain is the render's business (changed_services), never left out here.
    assert again.skipped == ("nat/KUBE-SERVICES",)
    assert again.text == f"*nat\n:{svc} - [0:0]\n-A {svc} -j RETURN\nCOMMIT\n"
    edited = text.replace("-A KUBE-SERVICES -j", "-A KUBE-SERVICES -p tcp -j")
    assert applied.filter(edited, full=False).skipped == ()
    applied.forget()
    assert applied.filter(text, full=False).skipped == ()


def test_a_resync_without_changes_rewrites_the_shared_chains_and_repairs_them() -> None:
    node = FakeNamespace()
    node.run(["iptables-restore", "--noflush"], input=FOREIGN)
    counters = ensure_nfacct_counters(NFACCT_COUNTERS, node.run)
    demo = _demo(counters)
    proxier = IptablesProxier(run=node.run)
    proxier.ensure_canary()
    proxier.sync(demo.view, demo.options, None)
    before = _tables(node.run, "")["nat"]["KUBE-SERVICES"]
    assert before
    node.run(["iptables", "-t", "nat", "-F", "KUBE-SERVICES"])  # someone edits our chain behind our back
    changed = proxier.sync(_fewer_endpoints(demo.view, WEB), demo.options, frozenset({WEB}))
    assert "nat/KUBE-SERVICES" in changed.skipped_chains  # a sync with changes trusts what it wrote
    resync = proxier.sync(_fewer_endpoints(demo.view, WEB), demo.options, frozenset())
    assert resync.skipped_chains == ()
    assert _tables(node.run, "")["nat"]["KUBE-SERVICES"] == before

"""Upstream's TestSyncProxyRulesRepeated, replayed through the change tracker and partial renders.

Each step's objects.yaml is the cluster at that step; we feed the difference from the previous
step as events, take the tracker's changes, render with the kernel's current nat chains and load
the text into a small model of iptables-restore --noflush. Step 9 repeats upstream's trap: a
bogus rule keeps a stale chain busy, the partial sync is refused, and the retry is a full sync.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy.backends.iptables.apply import ensure_nfacct_counters, restore
from kubeproxy.backends.iptables.render import (
    LARGE_CLUSTER_ENDPOINTS,
    Rendered,
    render,
)
from kubeproxy.cluster.addresses import AddressText
from kubeproxy.cluster.manifests import load_manifests
from kubeproxy.cluster.state import ClusterState
from kubeproxy.lab.netns import NetNS
from kubeproxy.model.changes import ChangeTracker
from kubeproxy.model.node_model import EndpointInfo, NodeView, build_view
from kubeproxy.model.options import NFACCT_COUNTERS, NodeOptions
from tests.backends.iptables.canonical import diff, uncommented
from tests.backends.iptables.rules_invariants import check_invariants
from tests.backends.iptables.rules_invariants import parse as parse_rules
from tests.backends.iptables.test_upstream_fixtures import FIXTURES, fixture_options

STEPS = [FIXTURES / f"test_sync_proxy_rules_repeated_step{i}" for i in range(1, 10)]
# What upstream's step 9 injects into its fake iptables before deleting ns4/svc4.
BOGUS_CHAIN, BOGUS_RULE = "KUBE-SVC-X27LE4BHSL4DOUIK", "-A KUBE-SVC-X27LE4BHSL4DOUIK -j KUBE-SEP-AYCN5HPXMIRJNJXU"


class RestoreRefused(Exception):
    pass


@dataclass
class FakeKernel:
    """iptables-restore --noflush on a dict: chain lines create or flush, -X refuses busy chains.

    Each table commits on its own, as iptables-restore does.
    """

    tables: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def chains(self, table: str) -> frozenset[str]:
        return frozenset(self.tables.get(table, {}))

    def restore(self, text: str) -> None:
        work: dict[str, list[str]] = {}
        table = ""
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            if line.startswith("*"):
                table = line[1:]
                work = {c: list(r) for c, r in self.tables.get(table, {}).items()}
            elif line == "COMMIT":
                self.tables[table] = work
            elif line.startswith(":"):
                work[line.split()[0][1:]] = []
            elif line.startswith("-A "):
                chain = line.split()[1]
                target = _jump_target(line)
                if chain not in work or (target.startswith("KUBE-") and target not in work):
                    raise RestoreRefused(f"no chain {chain} or {target}")
                work[chain].append(line)
            elif line.startswith("-X "):
                chain = line.split()[1]
                users = [r for rules in work.values() for r in rules if _jump_target(r) == chain]
                if chain not in work or users:
                    raise RestoreRefused(f"cannot delete {chain}: {users or 'missing'}")
                del work[chain]
            else:
                raise RestoreRefused(f"unexpected line {line!r}")


def _jump_target(rule: str) -> str:
    parts = rule.split()
    return parts[parts.index("-j") + 1] if "-j" in parts else ""


def step_options(case: Path) -> NodeOptions:
    """The options of upstream's repeated-sync test (no Node object in it)."""
    return fixture_options(case)


ObjKey = tuple[str, str, str]


def load_objects(case: Path) -> dict[ObjKey, Mapping[str, Any]]:
    out: dict[ObjKey, Mapping[str, Any]] = {}
    for r in load_manifests([case / "objects.yaml"]):
        meta = r.obj["metadata"]
        out[(r.obj["kind"], meta.get("namespace", "default"), meta["name"])] = r.obj
    return out


@dataclass
class Proxy:
    """Just enough of a proxier to drive the tracker and renderer step by step."""

    opts: NodeOptions
    kernel: Any  # FakeKernel or the namespace-backed one below
    state: ClusterState = field(default_factory=ClusterState)
    tracker: ChangeTracker = field(default_factory=ChangeTracker)
    objects: dict[ObjKey, Mapping[str, Any]] = field(default_factory=dict)

    def feed(self, objects: dict[ObjKey, Mapping[str, Any]]) -> None:
        for key, obj in self.objects.items():
            if key not in objects:
                assert self.tracker.apply(self.state, obj, deleted=True) is None
        for obj in objects.values():
            # Unchanged objects are re-applied too, like an informer resync: no-ops must vanish.
            assert self.tracker.apply(self.state, obj) is None
        self.objects = dict(objects)

    def view(self) -> NodeView:
        return build_view(self.state.services.values(), self.state.slices.values(), self.opts.family, self.opts.node_name)

    def sync(self) -> Rendered:
        """One sync; on a refused restore, ask for a full sync next time (as upstream does)."""
        view = self.view()
        changes = self.tracker.take(view)
        rendered = render(
            view, self.opts, changed_services=changes.changed_services, existing_nat_chains=self.kernel.chains("nat")
        )
        try:
            self.kernel.restore(rendered.text)
        except Exception:
            self.tracker.request_full_sync()
            raise
        return rendered


def full_render(proxy: Proxy) -> Rendered:
    return render(proxy.view(), proxy.opts)


def replay(proxy: Proxy, refused: type[Exception], inject_bogus_rule: Any) -> list[tuple[Path, Rendered, Rendered]]:
    """(step, what the step's sync wrote, a full rendering of the same state) for every step."""
    out = []
    for case in STEPS:
        sync = yaml.safe_load((case / "sync.yaml").read_text())
        proxy.feed(load_objects(case))
        if sync["step"] == 9:
            inject_bogus_rule()
            with pytest.raises(refused):
                proxy.sync()
        rendered = proxy.sync()
        assert rendered.full_sync == sync["full_sync"], case.name
        out.append((case, rendered, full_render(proxy)))
    return out


def test_repeated_syncs_match_upstream() -> None:
    kernel = FakeKernel()
    proxy = Proxy(step_options(STEPS[0]), kernel)

    def inject() -> None:
        kernel.tables["nat"][BOGUS_CHAIN].append(BOGUS_RULE)

    for case, rendered, full in replay(proxy, RestoreRefused, inject):
        problems = diff((case / "expected.rules").read_text(), rendered.text)
        assert not problems, f"{case.name} differs from upstream:\n{problems}"
        if rendered.full_sync and not rendered.deleted_chains:
            # A partial text jumps to chains it does not declare; a deleting one declares unused ones.
            check_invariants(rendered.text)
        # Metrics count what the kernel holds, written or skipped, as a full sync would.
        assert rendered.nat_rules_total == full.nat_rules
        assert rendered.filter_rules == full.filter_rules
        assert rendered.nat_chains == full.nat_chains

    # The kernel now holds exactly the full rendering of the final state: stale chains are gone.
    expected = parse_rules(full_render(proxy).text)["nat"]
    assert set(kernel.tables["nat"]) == set(expected[0])
    assert {c: r for c, r in kernel.tables["nat"].items() if r} == dict(expected[1])


def test_partial_sync_deletes_stale_chains_and_keeps_others() -> None:
    step = STEPS[2]  # svc2 deleted
    proxy = Proxy(step_options(step), FakeKernel())
    proxy.feed(load_objects(STEPS[0]))
    proxy.sync()
    proxy.kernel.tables["nat"]["SOMEONE-ELSES"] = []
    proxy.feed(load_objects(step))
    rendered = proxy.sync()
    assert rendered.deleted_chains == ("KUBE-SEP-UHEGFW77JX3KXTOV", "KUBE-SVC-2VJB64SDSIJUP5T6")
    assert "SOMEONE-ELSES" in proxy.kernel.chains("nat")
    assert rendered.stale_cleanup_done


def test_large_cluster_cleans_up_only_when_due() -> None:
    proxy = Proxy(step_options(STEPS[0]), FakeKernel())
    proxy.feed(load_objects(STEPS[0]))
    small = proxy.view()
    name = next(iter(small.services))
    many = [EndpointInfo(AddressText(f"10.1.{i // 250}.{i % 250}"), 80) for i in range(LARGE_CLUSTER_ENDPOINTS + 1)]
    large = NodeView({name: small.services[name]}, {name: many})
    existing = {"KUBE-SVC-GONEGONEGONEGONE", "KUBE-POSTROUTING"}

    assert render(small, proxy.opts, existing_nat_chains=existing, stale_cleanup_due=False).deleted_chains == (
        "KUBE-SVC-GONEGONEGONEGONE",
    )
    skipped = render(large, proxy.opts, existing_nat_chains=existing, stale_cleanup_due=False)
    assert skipped.large_cluster_mode and skipped.deleted_chains == () and not skipped.stale_cleanup_done
    due = render(large, proxy.opts, existing_nat_chains=existing, stale_cleanup_due=True)
    assert due.deleted_chains == ("KUBE-SVC-GONEGONEGONEGONE",) and due.stale_cleanup_done
    assert render(large, proxy.opts).deleted_chains == ()  # kernel state unknown: delete nothing


def test_full_sync_output_unchanged_by_new_arguments() -> None:
    proxy = Proxy(step_options(STEPS[0]), FakeKernel())
    proxy.feed(load_objects(STEPS[6]))
    view = proxy.view()
    plain = render(view, proxy.opts)
    assert render(view, proxy.opts, changed_services=None, existing_nat_chains=plain.nat_chains).text == plain.text


@dataclass
class NetnsKernel:
    """The same interface as FakeKernel, backed by the kernel of a test namespace."""

    ns: Any

    def chains(self, table: str) -> frozenset[str]:
        saved = self.ns.run(["iptables-save", "-t", table]).stdout
        return frozenset(line.split()[0][1:] for line in saved.splitlines() if line.startswith(":"))

    def restore(self, text: str) -> None:
        restore(text, self.ns)


@pytest.mark.root
def test_repeated_syncs_in_kernel(netns: NetNS) -> None:
    from kubeproxy.backends.iptables.apply import RestoreError

    counters = ensure_nfacct_counters(NFACCT_COUNTERS, netns)
    opts = dataclasses.replace(step_options(STEPS[0]), nfacct_counters=tuple(counters))
    proxy = Proxy(opts, NetnsKernel(netns))

    def inject() -> None:
        netns.run(["iptables", "-w", "-t", "nat", *BOGUS_RULE.split()])

    replay(proxy, RestoreError, inject)

    expected_declared, expected_rules = parse_rules(full_render(proxy).text)["nat"]
    saved_declared, saved_rules = parse_rules(netns.run(["iptables-save", "-t", "nat"]).stdout)["nat"]
    ours = {c for c in saved_declared if c.startswith("KUBE-")}
    assert ours == set(expected_declared)
    for chain in ours:
        assert len(saved_rules.get(chain, [])) == len(expected_rules.get(chain, [])), chain
    # A fresh full sync changes nothing: the partial syncs left the full state behind.
    before = netns.run(["iptables-save", "-t", "nat"]).stdout
    restore(full_render(proxy).text, netns)
    assert uncommented(netns.run(["iptables-save", "-t", "nat"]).stdout) == uncommented(before)

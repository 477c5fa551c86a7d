"""`render(..., cache=RenderCache())` must return exactly what `render` returns without one.

Proven on upstream's repeated-sync steps (the partial syncs of tests/backends/iptables/test_partial_sync.py), on
every golden scenario, and on random sequences of cluster edits, syncs (full and partial),
option changes and large-cluster mode switches; each time the whole `Rendered` (text and every
count) is compared. The cache's own counters show that it was actually used.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import Any, NamedTuple
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeproxy.backends.iptables import cache as cache_module
from kubeproxy.backends.iptables import render as render_module
from kubeproxy.backends.iptables.cache import RenderCache
from kubeproxy.backends.iptables.offline import NodeRendering, render_iptables
from kubeproxy.backends.iptables.render import Rendered, render
from kubeproxy.cli import build_config, main
from kubeproxy.cluster.manifest_load import load
from kubeproxy.cluster.state import ClusterState
from kubeproxy.model.changes import ChangeTracker
from kubeproxy.model.node_model import NodeView, ServicePortName, build_view
from kubeproxy.model.options import Family, NodeOptions
from kubeproxy.model.proxy_config import LocalDetector
from kubeproxy.model.view import ViewBuilder
from tests.backends.iptables.canonical import diff
from tests.backends.iptables.test_partial_sync import (
    BOGUS_CHAIN,
    BOGUS_RULE,
    STEPS,
    FakeKernel,
    Proxy,
    RestoreRefused,
    replay,
    step_options,
)
from tests.backends.iptables.test_render_golden import GOLDEN, SCENARIOS
from tests.model.test_view_cache import (
    NAMESPACES,
    SERVICES,
    apply_step,
    endpoint_slices,
    nodes,
    seed_objects,
    service_obj,
    services,
    slice_obj,
)

# -- upstream's repeated syncs


@dataclass
class CachedProxy(Proxy):
    """The step-by-step proxier of test_partial_sync, with the incremental view and a render cache."""

    builder: ViewBuilder = field(default_factory=ViewBuilder)
    cache: RenderCache = field(default_factory=RenderCache)
    rendered_ports: list[int] = field(default_factory=list)

    def sync(self) -> Rendered:
        view = self.builder.update(self.state, self.tracker.pending(), family=self.opts.family, node_name=self.opts.node_name)
        assert view == self.view()
        changes = self.tracker.take(view)
        args: dict[str, Any] = {"changed_services": changes.changed_services, "existing_nat_chains": self.kernel.chains("nat")}
        rendered = render(view, self.opts, cache=self.cache, **args)
        assert rendered == render(view, self.opts, **args)
        self.rendered_ports.append(self.cache.rendered)
        try:
            self.kernel.restore(rendered.text)
        except Exception:
            self.tracker.request_full_sync()
            raise
        return rendered


def test_repeated_syncs_with_cache_match_uncached_and_upstream() -> None:
    kernel = FakeKernel()
    proxy = CachedProxy(step_options(STEPS[0]), kernel)

    def inject() -> None:
        kernel.tables["nat"][BOGUS_CHAIN].append(BOGUS_RULE)

    results = replay(proxy, RestoreRefused, inject)
    for case, rendered, full in results:
        assert not diff((case / "expected.rules").read_text(), rendered.text), case.name
        assert rendered.nat_chains == full.nat_chains
    total = len(proxy.view().services)
    # The first sync renders everything; later ones only what changed (a few ports per step).
    assert proxy.rendered_ports[0] > 0
    assert all(n < total for n in proxy.rendered_ports[1:]), proxy.rendered_ports
    assert sum(proxy.rendered_ports[1:]) < total * (len(proxy.rendered_ports) - 1) / 2


# -- golden scenarios


def golden_rendering(name: str) -> NodeRendering:
    """The scenario's view and options, the way `kubeproxy render` makes them."""
    path = GOLDEN / f"{name}.yaml"
    args = shlex.split(path.read_text().splitlines()[0].removeprefix("# args:"))
    params = main.commands["render"].make_context("render", ["--manifests", str(path), *args]).params
    cfg = build_config(**params)
    return render_iptables(load([path]).state, cfg)


@pytest.mark.parametrize("name", SCENARIOS)
def test_golden_scenarios_with_cache(name: str) -> None:
    golden = golden_rendering(name)
    view, opts = golden.view, golden.options
    cache = RenderCache()

    cold = render(view, opts, cache=cache)
    assert cold.text == (GOLDEN / f"{name}.rules").read_text()
    assert cold == golden.rendered and cache.rendered == len(view.services)

    warm = render(view, opts, cache=cache)
    assert warm == cold and cache.rendered == 0 and cache.reused == len(view.services)

    # An equal view made of new objects, from a fresh parse: reused by equality.
    state = load([GOLDEN / f"{name}.yaml"]).state
    rebuilt = build_view(state.services.values(), state.slices.values(), opts.family, opts.node_name)
    assert rebuilt == view and next(iter(rebuilt.services.values())) is not next(iter(view.services.values()))
    assert render(rebuilt, opts, cache=cache) == cold and cache.rendered == 0

    for key in sorted({n.service for n in view.services}):
        existing = cold.nat_chains | {"KUBE-SVC-STALESTALESTALE"}
        partial = render(view, opts, changed_services={key}, existing_nat_chains=existing, cache=cache)
        assert partial == render(view, opts, changed_services={key}, existing_nat_chains=existing)


# -- cache invalidation


def test_options_changed_in_place_invalidate_the_cache() -> None:
    golden = golden_rendering("topology_zone_hints")
    view, opts = golden.view, golden.options
    cache = RenderCache()
    before = render(view, opts, cache=cache)
    assert isinstance(opts.node_labels, dict)
    opts.node_labels["topology.kubernetes.io/zone"] = "zone-b"
    after = render(view, opts)
    assert after != before  # the zone decides which endpoints are used
    assert render(view, opts, cache=cache) == after and cache.rendered == len(view.services)


def test_a_failed_render_leaves_a_usable_cache() -> None:
    golden = golden_rendering("cluster_ip")
    view, opts = golden.view, golden.options
    cache = RenderCache()
    broken = dataclasses.replace(opts, local_detector=LocalDetector("Bogus", ("10.0.0.0/8",)))
    with pytest.raises(ValueError, match="no local traffic detector"):
        render(view, broken, cache=cache)
    assert render(view, opts, cache=cache) == golden.rendered


# -- random sequences


class SyncPlan(NamedTuple):
    option: str  # which variant of the options (see `variant`)
    scope: str  # which services a partial sync writes: the tracker's, all (full sync), or `chosen`
    chosen: frozenset[tuple[str, str]]
    source: str  # the incremental view, or an equal one built anew (reuse by equality)
    kernel: str | None  # the nat chains the kernel is said to hold: unknown, the last active ones, plus a stale one


sync_plans = st.builds(
    SyncPlan,
    st.sampled_from(("plain", "plain", "plain", "masquerade_all", "zone", "no_detector")),
    st.sampled_from(("tracker", "tracker", "full", "chosen")),
    st.frozensets(st.tuples(st.sampled_from(NAMESPACES), st.sampled_from(SERVICES)), max_size=3),
    st.sampled_from(("builder", "builder", "fresh")),
    st.sampled_from((None, "active", "stale")),
)


@st.composite
def render_steps(draw: st.DrawFn) -> tuple[str, Any]:
    kind = draw(st.sampled_from(("apply", "apply", "apply", "delete", "sync", "sync", "fail")))
    if kind == "apply":
        return kind, draw(st.one_of(services(), endpoint_slices(), endpoint_slices(), nodes()))
    if kind == "delete":
        return kind, draw(st.one_of(services(), endpoint_slices()))
    return kind, draw(sync_plans) if kind == "sync" else None


def variant(opts: NodeOptions, name: str) -> NodeOptions:
    if name == "masquerade_all":
        return dataclasses.replace(opts, masquerade_all=True)
    if name == "zone":
        return dataclasses.replace(opts, node_labels={"topology.kubernetes.io/zone": "z1"})
    if name == "no_detector":
        return dataclasses.replace(opts, local_detector=LocalDetector())
    return opts


BASE = NodeOptions(node_name="n1", node_ip="192.0.2.10", local_detector=LocalDetector("ClusterCIDR", ("10.1.0.0/16",)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(render_steps(), min_size=8, max_size=40), st.sampled_from((5, 6, 1000)))
def test_random_sequences_render_the_same_with_and_without_cache(scenario: list[tuple[str, Any]], large_above: int) -> None:
    state, tracker, builder, cache = ClusterState(), ChangeTracker(node_name="n1"), ViewBuilder(), RenderCache()
    previous: Rendered | None = None
    seed = [("apply", obj) for obj in seed_objects()]
    last = ("sync", SyncPlan("plain", "tracker", frozenset(), "builder", None))
    # The seed has 6 endpoints: around these thresholds large-cluster mode comes and goes.
    with mock.patch.object(render_module, "LARGE_CLUSTER_ENDPOINTS", large_above):
        for kind, arg in [*seed, *scenario, last]:
            if kind == "fail":
                tracker.request_full_sync()
                continue
            if kind != "sync":
                apply_step(state, tracker, kind, arg)
                continue
            opts = variant(BASE, arg.option)
            view = builder.update(state, tracker.pending(), family=Family.IPV4, node_name="n1")
            changes = tracker.take(view)
            if arg.source == "fresh":
                view = NodeView(*_fresh(state))
            changed = {"tracker": changes.changed_services, "full": None, "chosen": arg.chosen}[arg.scope]
            existing: frozenset[str] | None = None
            if arg.kernel is not None and previous is not None:
                existing = previous.nat_chains | ({"KUBE-SEP-STALESTALESTALE"} if arg.kernel == "stale" else set())
            args: dict[str, Any] = {"changed_services": changed, "existing_nat_chains": existing}
            cached = render(view, opts, cache=cache, **args)
            assert cached == render(view, opts, **args)
            previous = cached


def _fresh(state: ClusterState) -> tuple[Any, Any]:
    fresh = build_view(state.services.values(), state.slices.values(), Family.IPV4, "n1")
    return fresh.services, fresh.endpoints


def test_one_endpoint_change_renders_one_service_port() -> None:
    state, tracker, builder, cache = ClusterState(), ChangeTracker(node_name="n1"), ViewBuilder(), RenderCache()
    for i in range(20):
        tracker.apply(state, service_obj(f"s{i}", f"10.96.0.{i + 1}"))
        tracker.apply(state, slice_obj(f"s{i}-1", f"s{i}", ["10.1.0.1", "10.1.0.2"]))
    view = builder.update(state, tracker.pending(), family=Family.IPV4, node_name="n1")
    render(view, BASE, changed_services=tracker.take(view).changed_services, cache=cache)
    assert cache.rendered == 20

    tracker.apply(state, slice_obj("s7-1", "s7", ["10.1.0.1", "10.1.0.3"]))
    view = builder.update(state, tracker.pending(), family=Family.IPV4, node_name="n1")
    changed = tracker.take(view).changed_services
    assert changed == frozenset({("a", "s7")})
    partial = render(view, BASE, changed_services=changed, cache=cache)
    assert (cache.rendered, cache.reused) == (1, 19)
    assert partial == render(view, BASE, changed_services=changed)
    assert "10.1.0.3:8080" in partial.text and partial.skipped_nat_chains > 0


def test_large_cluster_mode_switch_rerenders_unchanged_services() -> None:
    state, tracker, builder, cache = ClusterState(), ChangeTracker(node_name="n1"), ViewBuilder(), RenderCache()
    for obj in seed_objects():
        tracker.apply(state, obj)
    view = builder.update(state, tracker.pending(), family=Family.IPV4, node_name="n1")
    with mock.patch.object(render_module, "LARGE_CLUSTER_ENDPOINTS", view.total_endpoints):
        small = render(view, BASE, changed_services=tracker.take(view).changed_services, cache=cache)
        assert not small.large_cluster_mode
        tracker.apply(state, slice_obj("e1", "s1", ["10.1.0.1", "10.1.0.2", "10.1.0.3"]))
        view = builder.update(state, tracker.pending(), family=Family.IPV4, node_name="n1")
        changed = tracker.take(view).changed_services
        assert changed == frozenset({("a", "s1")})
        large = render(view, BASE, changed_services=changed, cache=cache)
        assert large.large_cluster_mode and cache.reused == 0
        assert large == render(view, BASE, changed_services=changed)


# -- what the cache keeps


def test_the_cache_keeps_no_chain_text_and_renders_it_again_for_written_ports() -> None:
    golden = golden_rendering("cluster_ip")
    view, opts = golden.view, golden.options
    cache = RenderCache()
    ports = len(view.services)
    assert render(view, opts, cache=cache) == golden.rendered
    assert (cache.rendered, cache.rewritten) == (ports, 0)  # the first render has every text already
    # Only what unchanged ports contribute to every sync is kept: no own chains' text.
    memos = cache._memos
    assert memos and all(m.rules is not None and m.rules.chain_text == m.rules.chain_decls == "" for m in memos)
    assert any(m.rules is not None and m.rules.chains for m in memos)

    # A full render from the cache writes every chain: each port's text rendered again, equal.
    assert render(view, opts, cache=cache) == golden.rendered
    assert (cache.rendered, cache.reused, cache.rewritten) == (0, ports, ports)

    # A partial sync naming a service whose objects did not change (touched, say): only its ports.
    key = sorted(view.services)[0].service
    mine = sum(1 for name in view.services if name.service == key)
    args: dict[str, Any] = {"changed_services": {key}, "existing_nat_chains": golden.rendered.nat_chains}
    assert render(view, opts, cache=cache, **args) == render(view, opts, **args)
    assert (cache.rendered, cache.rewritten) == (0, mine)
    # A partial sync naming nothing writes no service chain and renders nothing.
    assert render(view, opts, cache=cache, changed_services=set()) == render(view, opts, changed_services=set())
    assert (cache.rendered, cache.rewritten) == (0, 0)


port_names = st.builds(
    ServicePortName,
    st.sampled_from(("a", "b", "kube-system")),
    st.sampled_from(("s1", "s2", "s10", "web")),
    st.sampled_from(("", "http", "https", "dns")),
    st.sampled_from(("TCP", "UDP")),
)


@given(
    st.sets(port_names, max_size=30),
    st.frozensets(st.tuples(st.sampled_from(("a", "b", "c")), st.sampled_from(("s1", "s2", "web", "x")))),
)
def test_written_ports_found_by_bisection_equal_a_scan(ports: set[ServicePortName], services: frozenset[tuple[str, str]]) -> None:
    ordered = sorted(ports)
    scan = [i for i, p in enumerate(ordered) if p.service in services]
    with mock.patch.object(cache_module, "_BISECT_RATIO", 0):  # always the scan
        assert list(cache_module._indices_of(ordered, services)) == scan
    with mock.patch.object(cache_module, "_BISECT_RATIO", 10**9):  # always bisection
        assert list(cache_module._indices_of(ordered, services)) == scan

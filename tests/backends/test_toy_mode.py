"""A fifth mode is one registry entry and its own code: a toy mode, all of it in this file, runs
through the CLI's mode list and `render`, the configuration's checks, the backend contract on
the fake node, `kubeproxy cleanup` and the live proxy, without a line changed anywhere else; a
configuration file, the start-up line, node options, `explain` and the DNS lab take what they
need to know about it from its `Mode` record (test_mode_sites.py: no other file decides by a
mode's name).

The toy programs a tool of its own, `toyctl`, whose fake this file brings (the mode's
`fake_tools`): `toyctl load` takes one `IP:PORT/PROTO -> ENDPOINTS` line per Service port,
`toyctl show` lists them, `toyctl flush` removes them.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeproxy.backends import registry
from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.nftables.annotations import UDP_CONNTRACK_TIMEOUT
from kubeproxy.cluster.state import ClusterState
from kubeproxy.kernel.exec import Runner
from kubeproxy.model.contract import OfflineOptions, OfflineText, SyncError
from kubeproxy.model.metrics import FamilyMetrics
from kubeproxy.model.node_model import NodeView
from kubeproxy.model.options import Family, NodeOptions, node_options
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.config import load_config_file, to_kube_proxy_configuration, validate
from kubeproxy.proxy.startup import summary
from kubeproxy.sources.events import WatchEvent
from tests.backends.test_contract import contract
from tests.paths import DEMO

TOOL = "toyctl"


@dataclass
class FakeToyctl:
    lines: list[str] = field(default_factory=list)

    def handles(self, argv: Sequence[str]) -> bool:
        return argv[0] == TOOL

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        out = ""
        if argv[1] == "load":
            self.lines = (input or "").splitlines()
        elif argv[1] == "show":
            out = "".join(f"{line}\n" for line in self.lines)
        elif argv[1] == "flush":
            out, self.lines = f"{len(self.lines)}\n", []
        return subprocess.CompletedProcess(list(argv), 0, out, "")


def toy_lines(view: NodeView) -> str:
    return "".join(
        f"{svc.cluster_ip}:{svc.port}/{svc.protocol} -> {','.join(f'{e.ip}:{e.port}' for e in view.endpoints.get(name, ()))}\n"
        for name, svc in sorted(view.services.items())
    )


@dataclass(frozen=True)
class ToyReport:
    full: bool
    no_local_endpoints_internal: int = 0
    no_local_endpoints_external: int = 0
    rule_counts: Mapping[str, int] = field(default_factory=dict)
    written_rule_counts: Mapping[str, int] = field(default_factory=dict)


@dataclass
class ToyBackend:
    run: Runner
    family: Family = Family.IPV4
    nfacct_counters: tuple[str, ...] = ()

    def prepare(self) -> None:
        pass

    def sync(self, view: NodeView, opts: NodeOptions, changed_services: frozenset[tuple[str, str]] | None) -> ToyReport:
        proc = self.run([TOOL, "load"], input=toy_lines(view), check=False)
        if proc.returncode != 0:
            raise SyncError(f"{TOOL} load: {proc.stderr}")
        return ToyReport(full=changed_services is None)

    def check(self, view: NodeView, opts: NodeOptions) -> str | None:
        return None

    def record_failure(self, metrics: FamilyMetrics, exc: Exception, partial: bool) -> None:
        metrics.restore_failures_total.inc()

    def rules_intact(self) -> bool:
        return True  # a mode that syncs every syncPeriod (its Mode record leaves quiet_resync off)

    def cleanup(self) -> list[str]:
        return toy_cleanup(self.run, self.family)


def toy_cleanup(run: Runner, family: Family) -> list[str]:
    count = int(run([TOOL, "flush"]).stdout or 0)
    return [f"{count} toy rules"] if count else []


def render_text(state: ClusterState, cfg: ProxyConfig, options: OfflineOptions) -> OfflineText:
    return OfflineText("".join(f"toy {key[0]}/{key[1]}\n" for key in sorted(state.services)))


TOY = registry.Mode(
    "toy",
    lambda run, sync_period, variant, cfg: ToyBackend(run),
    __name__,  # this module's render_text
    toy_cleanup,
    tools=lambda variant: (TOOL,),
    upstream_dual_stack=False,
    metrics=(registry.RESTORE_FAILURES,),
    failure_metric=registry.RESTORE_FAILURES,
    fake_tools=(FakeToyctl,),
    listings=((TOOL, "show"),),
)


@pytest.fixture(autouse=True)
def toy_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry.MODES, "toy", TOY)


def test_the_toy_is_a_mode_of_the_cli_and_the_configuration() -> None:
    from kubeproxy.cli import main
    from kubeproxy.proxy.flags import usage

    assert validate(ProxyConfig(mode="toy")).mode == "toy"
    assert "'toy'" in usage()
    result = CliRunner().invoke(main, ["render", "--proxy-mode", "toy", "--manifests", str(DEMO)])
    assert result.exit_code == 0, result.output
    assert "toy default/" in result.output
    refused = CliRunner().invoke(main, ["render", "--proxy-mode", "toys", "--manifests", str(DEMO)])
    assert refused.exit_code != 0 and "'toy'" in refused.output


def test_the_toy_keeps_the_backend_contract_on_the_fake_node() -> None:
    contract("toy", FakeNode())


def test_kubeproxy_cleanup_removes_the_toys_rules_with_every_other_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeproxy.cli import main
    from kubeproxy.kernel import exec as kexec

    # Each mode's modules are imported before the CLI's node is swapped: one imported while
    # local_run is the fake would keep the fake as its default runner.
    assert registry.cleanup_all(FakeNode(), list(Family)).errors == ()
    node = FakeNode()
    node.run([TOOL, "load"], input="10.96.0.1:443/TCP -> 192.168.0.2:6443\n")
    monkeypatch.setattr(kexec, "local_run", node)  # the CLI's node is the fake one
    result = CliRunner().invoke(main, ["cleanup"])
    assert result.exit_code == 0, result.output
    assert "removed 1 toy rules" in result.output
    assert node.run([TOOL, "show"]).stdout == ""


def test_the_live_proxy_runs_the_toy(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubeproxy.proxy.live_loop import LiveProxy
    from tests.live.test_live import _service

    node = FakeNode()
    cfg = ProxyConfig(
        mode="toy", cluster_cidr=("10.244.0.0/16",), min_sync_period=0.0, healthz_bind_address="", metrics_bind_address=""
    )
    proxy = LiveProxy(cfg, "node-1", run_cmd=node)

    @dataclass
    class Source:
        connected: bool = True

        async def run(self) -> None:
            for obj in _service("web", "10.96.7.7", ["10.244.1.5"]):
                proxy.on_event(WatchEvent("ADDED", obj["kind"], obj))
            await asyncio.Event().wait()

        async def wait_synced(self) -> None:
            pass

    async def main() -> None:
        task = asyncio.create_task(proxy.serve(Source()))
        try:
            await asyncio.wait_for(proxy.wait_for_syncs(1), 10)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    assert node.run([TOOL, "show"]).stdout.startswith("10.96.7.7:")


def test_a_configuration_file_of_the_toy_mode(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: toy\n"
        "portRange: 30000-30100\nudpIdleTimeout: 1s\n"
    )
    cfg = load_config_file(path)
    assert cfg.mode == "toy"
    assert cfg.unused_fields == (
        "portRange: used only by the userspace mode; ignored",
        "udpIdleTimeout: used only by the userspace mode; ignored",
    )
    written = to_kube_proxy_configuration(cfg)
    assert written["mode"] == "toy" and "udpIdleTimeout" not in written
    assert "udpIdleTimeout" in to_kube_proxy_configuration(ProxyConfig(mode="userspace"))


def test_the_toys_start_up_line_and_node_options() -> None:
    def variant(mode: str) -> object:
        cfg = ProxyConfig(mode=mode)
        return summary(cfg, node_name="n", node_from="flag", facts=None, iptables_variant="legacy", source="s")["iptablesVariant"]

    assert (variant("toy"), variant("iptables")) == ("n/a", "legacy")
    gate = {"KubeProxyNFTablesLocalhostNodePorts": True}
    for mode, listener in (("toy", False), ("nftables", True)):
        cfg = ProxyConfig(mode=mode, feature_gates=gate, nodeport_addresses=("127.0.0.0/8",))
        opts = node_options(cfg, family=Family.IPV4, hostname="n", node=None, nodeports=registry.nodeport_traits(mode))
        assert opts.localhost_nodeport_proxy is listener, mode


def test_explain_renders_the_toy_and_says_it_cannot_read_its_rules() -> None:
    from kubeproxy.explain.command import explain

    result = CliRunner().invoke(explain, ["default/web", "--manifests", str(DEMO), "--proxy-mode", "toy"])
    assert result.exit_code == 2
    assert "--proxy-mode toy: explain cannot read this mode's rules" in result.output
    refused = CliRunner().invoke(explain, ["default/web", "--manifests", str(DEMO), "--proxy-mode", "toys"])
    assert refused.exit_code == 2 and "'toy'" in refused.output


def test_the_dns_labs_scenario_in_the_toy_mode() -> None:
    from kubeproxy.lab.dns.scenarios import Scenario

    annotations = {UDP_CONNTRACK_TIMEOUT: "5s"}
    toy = Scenario("toy", "the toy mode", proxy_mode="toy", annotations=annotations)
    assert toy.masquerades_external and toy.service_udp_timeout is None
    assert Scenario("nft", "nftables", proxy_mode="nftables", annotations=annotations).service_udp_timeout == 5
    assert not Scenario("relay", "the userspace relay", proxy_mode="userspace").masquerades_external

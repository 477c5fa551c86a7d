"""`kubeproxy doctor --kubeconfig`: the objects from our test API server give the same findings as --manifests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.cli import main
from kubeproxy.lab import builders as O
from kubeproxy.lab.apiserver import ApiServer
from tests.doctor.helpers import CFG, NODE_IFACES, NODE_ROUTES, dns_world, state_of


def _world() -> list[dict[str, Any]]:
    # the snat world, plus a Service with no endpoints and one for another proxy (not ours: filtered by label)
    objs = dns_world(pods=2)
    objs.append(O.service("empty", "10.96.0.60", [O.Port("http", 80, 8080)]))
    other = O.service("other", "10.96.0.61", [O.Port("http", 80, 8080)],
                      labels={"service.kubernetes.io/service-proxy-name": "someone-else"})
    objs.append(other)
    return objs


def _args(tmp: Path, objs: list[dict[str, Any]]) -> list[str]:
    rules = tmp / "rules.iptables-save"
    rules.write_text(with_jumps(render_iptables(state_of(objs), CFG).rendered.text))
    args = ["doctor", "--rules", str(rules), "--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16", "--json"]
    for i in NODE_IFACES:
        args += ["--iface", i]
    for r in NODE_ROUTES:
        args += ["--route", r]
    return args


def _findings(result: Any) -> list[dict[str, Any]]:
    assert result.exit_code in (0, 1), result.output
    return list(json.loads(result.stdout)["findings"])


def test_doctor_reads_the_objects_from_the_api_server_with_the_same_findings(tmp_path: Path) -> None:
    objs = _world()
    args = _args(tmp_path, objs)
    manifests = tmp_path / "objects.yaml"
    manifests.write_text(yaml.safe_dump_all(objs))
    runner = CliRunner()
    from_files = _findings(runner.invoke(main, [*args, "--manifests", str(manifests)]))
    with ApiServer() as server:
        for obj in objs:
            server.apply(obj)
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        got = runner.invoke(main, [*args, "--kubeconfig", str(kubeconfig)])
    from_api = _findings(got)
    assert from_api == from_files
    kinds = {f["kind"] for f in from_api}
    assert "snat-capacity" in kinds and "no-endpoints" in kinds, kinds
    assert not any("default/other" in f["subject"] for f in from_api)  # another proxy's Service
    assert any("objects from the API server" in n for n in json.loads(got.stdout)["notes"])


def test_an_unreachable_api_server_is_named_and_exits_2(tmp_path: Path) -> None:
    with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        url = server.url
    # the server is gone: nothing listens on its port any more
    result = CliRunner().invoke(main, [*_args(tmp_path, dns_world()), "--kubeconfig", str(kubeconfig),
                                       "--api-timeout", "1"])
    assert result.exit_code == 2
    assert url in result.stderr and "not listed within 1 s" in result.stderr
    assert "Traceback" not in result.output


def test_manifests_and_kubeconfig_together_are_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, [*_args(tmp_path, dns_world()), "--manifests", "x.yaml", "--kubeconfig", "k"])
    assert result.exit_code == 2 and "not both" in result.output

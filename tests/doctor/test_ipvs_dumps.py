"""`kubeproxy doctor --rules` of an IPVS-mode node with its `ipvsadm-save -n` and `ipset save`:
new flows are traced through the virtual servers, and NodePorts only on the addresses the node
has virtual servers for (nodePortAddresses as the proxy applied it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kubeproxy.cli import main
from tests.explain.test_explain import NODE, _ipvs_dumps, _world


def _doctor(dumps: dict[str, Path], world: str, *ipvs: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["doctor", "--rules", str(dumps["iptables"]), *ipvs, "--manifests", world, *NODE,
                                    "--json"])
    assert res.exit_code in (0, 1), res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_an_ipvs_node_is_traced_through_its_virtual_servers(tmp_path: Path) -> None:
    world = str(_world(tmp_path))
    dumps = _ipvs_dumps(tmp_path, world)
    # the iptables rules alone do not translate a Service: IPVS does
    alone = _doctor(dumps, world)
    assert {f["kind"] for f in alone["findings"]} >= {"not-translated"}
    report = _doctor(dumps, world, "--ipvs", str(dumps["ipvs"]), "--ipset-file", str(dumps["ipset"]))
    assert report["inputs"]["rules"]["mode"] == "ipvs"
    assert "not-translated" not in {f["kind"] for f in report["findings"]}
    assert any(f["kind"] == "snat-capacity" for f in report["findings"])
    # three NodePort frontends fewer than the rules alone give: none on the pod bridge's address
    assert report["inputs"]["frontends_traced"] == alone["inputs"]["frontends_traced"] - 3


def test_ipvs_nodeports_are_probed_where_the_virtual_servers_are(tmp_path: Path) -> None:
    """The same node with its NodePorts' virtual servers on the bridge's address only: probed
    there, the primary address's NodePorts (which nothing serves) are not a finding."""
    world = str(_world(tmp_path))
    dumps = _ipvs_dumps(tmp_path, world)
    dumps["ipvs"].write_text(dumps["ipvs"].read_text().replace("192.168.0.2:", "10.244.1.1:"))
    report = _doctor(dumps, world, "--ipvs", str(dumps["ipvs"]), "--ipset-file", str(dumps["ipset"]))
    assert "not-translated" not in {f["kind"] for f in report["findings"]}
    explained = CliRunner().invoke(main, ["explain", "default/lb", "--rules", str(dumps["iptables"]), "--ipvs",
                                          str(dumps["ipvs"]), "--ipset-file", str(dumps["ipset"]), "--manifests", world,
                                          *NODE, "--json"])
    nodeports = [a["address"] for p in json.loads(explained.stdout)["ports"] for a in p["addresses"]
                 if a["kind"] == "node port"]
    assert nodeports and all(a.startswith("10.244.1.1:") for a in nodeports)


def test_ipvs_dumps_go_with_rules() -> None:
    res = CliRunner().invoke(main, ["doctor", "--live", "--ipvs", "x"])
    assert res.exit_code == 2 and "--ipvs" in res.output


def test_kube_ipvs0_addresses_are_not_node_addresses(tmp_path: Path) -> None:
    """An IPVS node's service addresses sit on kube-ipvs0 (as --live reads it): no NodePort is
    probed on them."""
    world = str(_world(tmp_path))
    dumps = _ipvs_dumps(tmp_path, world)
    report = _doctor(dumps, world, "--ipvs", str(dumps["ipvs"]), "--ipset-file", str(dumps["ipset"]),
                     "--iface", "kube-ipvs0=10.96.0.53/32", "--iface", "kube-ipvs0=203.0.113.53/32")
    assert report["inputs"]["node"]["addresses"] == ["192.168.0.2", "10.244.1.1"]
    assert "not-translated" not in {f["kind"] for f in report["findings"]}

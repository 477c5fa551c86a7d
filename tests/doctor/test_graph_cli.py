"""`kubeproxy graph` (DOT from a dump) and the two commands' command lines."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeproxy.cli import main
from kubeproxy.doctor.graph import GraphError, build
from kubeproxy.netfilter import detect
from tests.doctor.helpers import SEED

NFT_FIXTURE = Path(__file__).parents[1] / "netfilter" / "fixtures" / "kube_proxy_nft.json"
RANDOM_FIXTURE = Path(__file__).parents[1] / "netfilter" / "fixtures" / "kube_random.iptables-save"
SEED_ARGS = ["--manifests", str(SEED / "objects.yaml"), "--cluster-cidr", "10.24.0.0/16",
             "--iface", "eth3=10.5.6.29/24", "--iface", "docker0=10.100.13.1/24", "--in-iface", "eth3"]


def _edges(dot: str) -> list[tuple[str, str, str]]:
    return [(a, b, lab or "") for a, b, lab in
            re.findall(r'^  "([^"]+)" -> "([^"]+)"(?: \[label="([^"]*)")?', dot, flags=re.M)]


def test_seed_graph_of_one_service() -> None:
    dot = build(detect.parse((SEED / "kube_proxy.iptables-save").read_text()), "default/ares-k29-bindapp").dot("g")
    edges = _edges(dot)
    assert ("KUBE-SVC-357LDXEIX7XFORLA", "KUBE-SEP-BCSN2HMZQJBRJOX4", "100%") in edges
    assert ("KUBE-SEP-BCSN2HMZQJBRJOX4", "KUBE-MARK-MASQ", "-s 10.100.13.3/32") in edges
    assert ("KUBE-POSTROUTING", "MASQUERADE", "-m mark --mark 0x4000/0x4000") in edges
    assert "DNAT 10.100.13.3:53" in dot
    # the kubernetes Service is another Service: not drawn
    assert "KUBE-SVC-NPX46M4PTMTKRN6Y" not in dot


def test_statistic_rules_become_shares_of_new_flows() -> None:
    dot = build(detect.parse(RANDOM_FIXTURE.read_text())).dot("g")
    shares = sorted(lab for a, b, lab in _edges(dot) if a.startswith("KUBE-SVC-") and b.startswith("KUBE-SEP-"))
    assert shares == ["25%", "25%", "50%"]  # the fixture's deliberately uneven 1/2, 1/4, 1/4


def test_nftables_graph_goes_through_the_maps() -> None:
    rs = detect.parse(NFT_FIXTURE.read_text())
    edges = _edges(build(rs, "ns1/svc1").dot("g"))
    assert ("services", "service-ULMVA6XW-ns1/svc1/udp/p53", "10.96.0.10 . udp . 53") in edges
    assert sorted(lab for a, b, lab in edges if b.startswith("endpoint-") and a.startswith("service-")) == ["50%", "50%"]
    assert not any("ns2/svc2" in b for _, b, _ in edges)


def test_graph_errors_name_the_problem() -> None:
    rs = detect.parse((SEED / "kube_proxy.iptables-save").read_text())
    with pytest.raises(GraphError, match="no rules for Service default/nope"):
        build(rs, "default/nope")
    with pytest.raises(GraphError, match="no kube-proxy rules"):
        build(detect.parse("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"))


def test_cli_doctor_json_and_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["doctor", "--rules", str(SEED / "kube_proxy.iptables-save"), *SEED_ARGS, "--json"])
    assert res.exit_code == 1, res.output  # critical: the dump's empty KUBE-SEP chain of default/kubernetes
    doc = json.loads(res.stdout)
    assert doc["version"] == 1 and set(doc) == {"version", "inputs", "summary", "findings", "notes"}
    assert [f["kind"] for f in doc["findings"]][:2] == ["not-translated", "snat-capacity"]
    assert set(doc["findings"][0]) == {"severity", "kind", "subject", "title", "evidence", "fixes", "data"}
    assert doc["summary"] == {"critical": 1, "warning": 1, "info": 1}
    # the manual dump: critical findings (the proxy's jumps are missing) -> exit 1
    res = runner.invoke(main, ["doctor", "--rules", str(SEED / "manual_dnat.iptables-save"), *SEED_ARGS])
    assert res.exit_code == 1
    assert "nat PREROUTING line 4: DNATs service traffic before the proxy's rules" in res.stdout
    # bad input: exit 2 with the line, no traceback
    bad = tmp_path / "bad.rules"
    bad.write_text("*nat\n-A PREROUTING -j\nCOMMIT\n")
    res = runner.invoke(main, ["doctor", "--rules", str(bad)])
    assert res.exit_code == 2 and "line 2" in res.stderr and "Traceback" not in res.output
    res = runner.invoke(main, ["doctor", "--rules", str(bad), "--sysctl", "oops"])
    assert res.exit_code == 2
    res = runner.invoke(main, ["doctor"])
    assert res.exit_code == 2 and "--rules" in res.output


def test_cli_graph_writes_dot(tmp_path: Path) -> None:
    out = tmp_path / "g.dot"
    res = CliRunner().invoke(main, ["graph", "--rules", str(SEED / "kube_proxy.iptables-save"),
                                    "--service", "default/ares-k29-bindapp", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith('digraph "default/ares-k29-bindapp" {')


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (scripts/setup installs it)")
def test_cli_graph_draws_svg_with_graphviz(tmp_path: Path) -> None:
    out = tmp_path / "g.svg"
    res = CliRunner().invoke(main, ["graph", "--rules", str(SEED / "kube_proxy.iptables-save"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "KUBE&#45;SEP&#45;BCSN2HMZQJBRJOX4" in svg

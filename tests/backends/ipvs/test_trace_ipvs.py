"""`kubeproxy trace` on an IPVS node: the iptables chains with their ipset matches, then the IPVS
virtual service and its real servers, then the masquerade in POSTROUTING. No root: the inputs are
our own IPVS render of a small cluster, dumped the way the kernel's tools print them
(iptables-save, `ipset save`, `ipvsadm-save -n`), plus an `ipvsadm -Ln` listing written by hand."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubeproxy.backends.ipvs.render import (
    FILTER_CHAINS,
    JUMPS,
    NAT_CHAINS,
    IpvsOptions,
    ipset_restore_text,
    ipvsadm_save_text,
    render,
)
from kubeproxy.cli import main
from kubeproxy.cluster.addresses import ip_text, valid_ip
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions
from kubeproxy.model.proxy_config import LocalDetector
from kubeproxy.netfilter.ipvs import IpvsParseError, parse_ipset_save, parse_ipvs

NODE_IP = "192.168.0.2"
NODE = ["--iface", "eth0=192.168.0.2/24", "--iface", "cni0=10.244.1.1/24",
        "--route", "10.244.2.0/24=eth0@192.168.0.3", "--route", "default=eth0@192.168.0.1"]


def _svc(ns: str, name: str, ip: str, port: int, proto: str, pods: list[tuple[str, int]],
         node_port: int = 0) -> tuple[ServicePortName, ServicePortInfo, list[EndpointInfo]]:
    spn = ServicePortName(ns, name, "p", proto)
    info = ServicePortInfo(spn, valid_ip(ip), port, proto, node_port=node_port)
    return spn, info, [EndpointInfo(ip_text(valid_ip(a)), p, is_local=a.startswith("10.244.1.")) for a, p in pods]


def _dumps(tmp_path: Path) -> dict[str, Path]:
    svcs = [
        _svc("kube-system", "kube-dns", "10.96.0.10", 53, "UDP", [("10.244.1.10", 53), ("10.244.2.10", 53)]),
        _svc("default", "web", "10.96.10.10", 80, "TCP", [("10.244.1.20", 8080), ("10.244.2.20", 8080)], 30080),
        _svc("default", "empty", "10.96.20.20", 80, "TCP", []),
    ]
    view = NodeView({n: i for n, i, _ in svcs}, {n: e for n, _, e in svcs})
    opts = NodeOptions(node_name="node-1", node_ip=NODE_IP,
                       local_detector=LocalDetector("ClusterCIDR", ("10.244.0.0/16",)))
    r = render(view, opts, IpvsOptions(node_addresses=(NODE_IP,)))
    nat_rules, flt_rules = r.iptables.split("*filter\n")
    builtin = {"nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"), "filter": ("INPUT", "FORWARD", "OUTPUT")}
    lines: list[str] = []
    for table, chains, body in (("nat", NAT_CHAINS, nat_rules), ("filter", FILTER_CHAINS, flt_rules)):
        lines += [f"*{table}", *(f":{c} ACCEPT [0:0]" for c in builtin[table]), *(f":{c} - [0:0]" for c in chains)]
        lines += [j.rule() for j in JUMPS if j.table == table]
        lines += [ln for ln in body.splitlines() if ln.startswith("-A ")]
        lines.append("COMMIT")
    paths = {"rules": tmp_path / "iptables-save.txt", "ipvs": tmp_path / "ipvsadm-save.txt",
             "ipsets": tmp_path / "ipset-save.txt"}
    paths["rules"].write_text("\n".join(lines) + "\n")
    paths["ipvs"].write_text(ipvsadm_save_text(r.services))
    paths["ipsets"].write_text(ipset_restore_text(r, opts))
    return paths


def _trace(paths: dict[str, Path], *args: str) -> dict[str, Any]:
    argv = ["trace", "--rules", str(paths["rules"]), "--ipvs", str(paths["ipvs"]), "--ipset-file", str(paths["ipsets"]),
            *NODE, "--json", *args]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.stdout)
    return out


def _hops(outcome: dict[str, Any]) -> list[str]:
    return [f"{h['table']} {h['chain']} -> {h['target']}" for h in outcome["path"]]


def test_pod_to_dns_goes_to_each_real_server_without_masquerade(tmp_path: Path) -> None:
    out = _trace(_dumps(tmp_path), "--proto", "udp", "--src", "10.244.1.5:40000", "--dst", "10.96.0.10:53",
                 "--in-iface", "cni0")
    got = {(o["dst"], o["out_iface"], o["masquerade"], o["probability"]) for o in out["outcomes"]}
    assert got == {("10.244.1.10:53", "cni0", False, 0.5), ("10.244.2.10:53", "eth0", False, 0.5)}
    hops = _hops(out["outcomes"][0])
    # KUBE-SERVICES sends VIP traffic to KUBE-NODE-PORT (dst-type LOCAL), then accepts it by set
    assert "nat KUBE-SERVICES -> ACCEPT" in hops
    assert "filter KUBE-IPVS-FILTER -> RETURN" in hops
    ipvs = [h for h in out["outcomes"][0]["path"] if h["table"] == "ipvs"]
    assert ipvs[0]["chain"] == "10.96.0.10:53/UDP" and ipvs[0]["hook"] == "input"
    assert ipvs[0]["text"] == "IPVS virtual service 10.96.0.10:53/UDP -> real servers 10.244.1.10:53, 10.244.2.10:53 (rr)"
    assert hops.index("filter KUBE-IPVS-FILTER -> RETURN") < hops.index(f"ipvs 10.96.0.10:53/UDP -> {ipvs[0]['target']}")


def test_node_to_cluster_ip_is_masqueraded_after_ipvs(tmp_path: Path) -> None:
    out = _trace(_dumps(tmp_path), "--src", NODE_IP, "--dst", "10.96.10.10:80", "--from-host")
    assert {(o["dst"], o["masquerade"], o["verdict"]) for o in out["outcomes"]} == {
        ("10.244.1.20:8080", True, "ACCEPT"), ("10.244.2.20:8080", True, "ACCEPT")}
    hops = _hops(out["outcomes"][0])
    marked = hops.index("nat KUBE-SERVICES -> KUBE-MARK-MASQ")
    ipvs = next(i for i, h in enumerate(hops) if h.startswith("ipvs 10.96.10.10:80/TCP"))
    masq = hops.index("nat KUBE-POSTROUTING -> MASQUERADE")
    assert marked < ipvs < masq
    assert out["outcomes"][0]["path"][ipvs]["hook"] == "output"


def test_external_client_to_node_port(tmp_path: Path) -> None:
    out = _trace(_dumps(tmp_path), "--src", "203.0.113.7:50000", "--dst", f"{NODE_IP}:30080", "--in-iface", "eth0")
    assert {(o["dst"], o["masquerade"]) for o in out["outcomes"]} == {("10.244.1.20:8080", True), ("10.244.2.20:8080", True)}
    hops = _hops(out["outcomes"][0])
    assert "nat KUBE-NODE-PORT -> KUBE-MARK-MASQ" in hops  # the bitmap:port set matched the port


def test_service_without_endpoints_is_rejected_by_ipvs(tmp_path: Path) -> None:
    out = _trace(_dumps(tmp_path), "--src", "10.244.1.5:40000", "--dst", "10.96.20.20:80", "--in-iface", "cni0")
    (o,) = out["outcomes"]
    assert (o["verdict"], o["reject_with"]) == ("REJECT", "icmp-port-unreachable")
    assert o["path"][-1]["table"] == "ipvs"
    assert any("ip_vs_leave" in n for n in o["notes"])


def test_other_port_on_a_vip_is_rejected_by_kube_ipvs_filter(tmp_path: Path) -> None:
    out = _trace(_dumps(tmp_path), "--proto", "udp", "--src", "10.244.1.5:40000", "--dst", "10.96.0.10:5353",
                 "--in-iface", "cni0")
    (o,) = out["outcomes"]
    assert o["verdict"] == "REJECT"
    assert _hops(o)[-1] == "filter KUBE-IPVS-FILTER -> REJECT"
    assert not any(h["table"] == "ipvs" for h in o["path"])


def test_text_output_names_the_virtual_service_and_real_servers(tmp_path: Path) -> None:
    p = _dumps(tmp_path)
    argv = ["trace", "--rules", str(p["rules"]), "--ipvs", str(p["ipvs"]), "--ipset-file", str(p["ipsets"]), *NODE,
            "--proto", "udp", "--src", "10.244.1.5:40000", "--dst", "10.96.0.10:53", "--in-iface", "cni0"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    assert "IPVS virtual service 10.96.0.10:53/UDP -> real servers 10.244.1.10:53, 10.244.2.10:53 (rr)" in result.stdout
    assert "rr: connections go to the real servers in turn" in result.stdout


LN = """IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.96.10.10:80 sh persistent 10800
  -> 10.244.1.20:8080             Masq    1      3          1
  -> 10.244.2.20:8080             Masq    0      1          0
UDP  [fd00:10:96::a]:53 wrr
  -> [fd00:10:244:1::a]:53        Masq    3      0          7
  -> [fd00:10:244:2::a]:53        Masq    1      0          2
"""


def test_ipvsadm_ln_is_read_with_weights_counts_and_persistence() -> None:
    state = parse_ipvs(LN)
    tcp = next(vs for vs in state.services.values() if vs.protocol == "TCP")
    assert (tcp.scheduler, tcp.persistent, [(r.text(), r.weight, r.active, r.inactive) for r in tcp.reals]) == (
        "sh", 10800, [("10.244.1.20:8080", 1, 3, 1), ("10.244.2.20:8080", 0, 1, 0)])
    udp = next(vs for vs in state.services.values() if vs.protocol == "UDP")
    assert udp.label() == "[fd00:10:96::a]:53/UDP" and [r.weight for r in udp.reals] == [3, 1]


def test_quiesced_real_server_gets_no_new_connection_and_wrr_splits_by_weight(tmp_path: Path) -> None:
    p = _dumps(tmp_path)
    ln = tmp_path / "ipvsadm-Ln.txt"
    ln.write_text(LN.replace(" sh persistent 10800", " rr"))
    argv = ["trace", "--rules", str(p["rules"]), "--ipvs", str(ln), "--ipset-file", str(p["ipsets"]), *NODE, "--json",
            "--src", "10.244.1.5:40000", "--dst", "10.96.10.10:80", "--in-iface", "cni0"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    (o,) = json.loads(result.stdout)["outcomes"]
    assert o["dst"] == "10.244.1.20:8080"
    assert any("10.244.2.20:8080 has weight 0" in n for n in o["notes"])
    from kubeproxy.netfilter.simulate.ipvs_walk import _shares

    udp = next(vs for vs in parse_ipvs(LN).services.values() if vs.protocol == "UDP")
    shares, _why = _shares(udp)
    assert [(rs.text(), str(s)) for rs, s in shares] == [("[fd00:10:244:1::a]:53", "3/4"), ("[fd00:10:244:2::a]:53", "1/4")]


@pytest.mark.parametrize(("text", "problem"), [
    ("-A -t 10.96.0.1 -s rr\n", "--ipvs line 1: '10.96.0.1' is not ADDRESS:PORT"),
    ("-a -t 10.96.0.1:443 -r 10.0.0.1:6443 -m -w 1\n", "--ipvs line 1: real server for 10.96.0.1:443 before its `-A` line"),
    ("-A -t 10.96.0.1:443 -s rr\n-a -t 10.96.0.1:443 -r 10.0.0.1:6443 -m -w heavy\n", "--ipvs line 2: weight 'heavy'"),
    ("TCP  10.96.0.1:443 rr\n  -> 10.0.0.1:6443 Masq 1 0\n", "--ipvs line 2: expected `-> ADDRESS:PORT"),
    ("hello\n", "--ipvs line 1: not an `ipvsadm -Ln` or `ipvsadm-save -n` line"),
])
def test_bad_ipvs_dumps_name_the_line(text: str, problem: str) -> None:
    with pytest.raises(IpvsParseError, match=problem.replace("[", r"\[").replace("(", r"\(")):
        parse_ipvs(text)


def test_bad_dump_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    p = _dumps(tmp_path)
    bad = tmp_path / "bad.txt"
    bad.write_text("add KUBE-CLUSTER-IP 10.96.0.10,udp:53\n")
    argv = ["trace", "--rules", str(p["rules"]), "--ipvs", str(p["ipvs"]), "--ipset-file", str(bad), *NODE,
            "--src", "10.244.1.5", "--dst", "10.96.0.10:53", "--in-iface", "cni0"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2
    assert "--ipset-file line 1: `add KUBE-CLUSTER-IP` before `create KUBE-CLUSTER-IP`" in result.output
    assert "Traceback" not in result.output
    missing = CliRunner().invoke(main, [*argv[:3], "--ipvs", str(tmp_path / "nope"), *argv[5:]])
    assert missing.exit_code == 2 and "--ipvs" in missing.output and "Traceback" not in missing.output


def test_ipset_save_types_are_kept() -> None:
    dump = parse_ipset_save("create KUBE-NODE-PORT-TCP bitmap:port range 0-65535 comment\nadd KUBE-NODE-PORT-TCP 30080\n")
    assert dump.types == {"KUBE-NODE-PORT-TCP": "bitmap:port"} and dump.members == {"KUBE-NODE-PORT-TCP": ["30080"]}


def test_ipv6_members_and_three_part_sets_match() -> None:
    from kubeproxy.netfilter import addr as A
    from kubeproxy.netfilter.node import Node

    node = Node(ipsets={"KUBE-IPVS-IPS": ["fd00:10:96::a"], "KUBE-LOOP-BACK": ["10.244.1.10,tcp:80,10.244.1.10"]})
    vip, pod = A.parse_ip("fd00:10:96::a")[0], A.parse_ip("10.244.1.10")[0]
    assert node.in_ipset("KUBE-IPVS-IPS", [vip]) is True  # a bare IPv6 address (no /128), as `ipset save` prints it
    assert node.in_ipset("KUBE-LOOP-BACK", [pod, "tcp:80", pod]) is True
    assert node.in_ipset("KUBE-LOOP-BACK", [pod, "tcp:80", pod + 1]) is False


def test_hairpin_to_itself_is_masqueraded_by_loop_back_set(tmp_path: Path) -> None:
    out = _trace(_dumps(tmp_path), "--proto", "udp", "--src", "10.244.1.10:40000", "--dst", "10.96.0.10:53",
                 "--in-iface", "cni0")
    by_dst = {o["dst"]: o for o in out["outcomes"]}
    assert by_dst["10.244.1.10:53"]["masquerade"] is True  # KUBE-LOOP-BACK dst,dst,src
    assert "nat KUBE-POSTROUTING -> MASQUERADE" in _hops(by_dst["10.244.1.10:53"])
    assert by_dst["10.244.2.10:53"]["masquerade"] is False

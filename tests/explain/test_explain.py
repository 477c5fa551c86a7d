"""`kubeproxy explain NAMESPACE/NAME`: a Service's rules in the order a new flow meets them, in
every mode, from the objects rendered, from a dump alone, and from what the kernel holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubeproxy.backends.iptables.apply import ensure_nfacct_counters
from kubeproxy.cli import main
from kubeproxy.explain.rendered import _ipvs_parts, _with_ipvs_jumps
from kubeproxy.lab import netns as L
from kubeproxy.lab.netns import have_root
from kubeproxy.model.options import NFACCT_COUNTERS
from tests.doctor.helpers import SEED
from tests.doctor.test_rules_alone import _affinity_and_local_world

NODE = ["--hostname-override", "node-1", "--cluster-cidr", "10.244.0.0/16", "--iface", "eth0=192.168.0.2/24",
        "--iface", "cni0=10.244.1.1/24", "--route", "10.244.0.0/16=cni0", "--route", "default=eth0@192.168.0.1"]
SERVICES = ("default/dns", "default/web", "default/lb", "default/empty")


def _world(tmp_path: Path) -> Path:
    path = tmp_path / "world.yaml"
    path.write_text("".join(f"---\n{json.dumps(o)}\n" for o in _affinity_and_local_world()))
    return path


def _explain(*args: str) -> dict[str, Any]:
    res = CliRunner().invoke(main, ["explain", *args, "--json"])
    assert res.exit_code == 0, res.output
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def _destinations(exp: dict[str, Any]) -> dict[tuple[str, str], set[tuple[str, float]]]:
    # a reject's ICMP type is spelt as each tool prints it: the verdict is what is compared
    return {(p["name"], a["address"]): {(d["to"].split(" (")[0], round(d["share"], 6)) for d in a["destinations"]}
            for p in exp["ports"] for a in p["addresses"]}


def _modes() -> list[str]:
    return ["iptables", "ipvs", "nftables"] if have_root() else ["iptables", "ipvs"]


@pytest.mark.parametrize("service", SERVICES)
def test_every_mode_sends_each_address_to_the_same_endpoints(tmp_path: Path, service: str) -> None:
    """The same Service rendered in each mode: every address's new flows end at the same
    endpoints with the same shares (nftables is read by nft, so it needs root)."""
    world = str(_world(tmp_path))
    by_mode = {m: _destinations(_explain(service, "--manifests", world, "--proxy-mode", m, *NODE)) for m in _modes()}
    # A NodePort on the pod bridge's address answers in iptables mode only: its NodePorts take
    # every local address, IPVS and nftables modes' the Node's (upstream's defaults by mode).
    by_mode = {m: {k: v for k, v in got.items() if not k[1].startswith("10.244.1.1:")} for m, got in by_mode.items()}
    first = by_mode["iptables"]
    assert first, service
    for mode, got in by_mode.items():
        assert got == first, mode


@pytest.mark.parametrize("service", SERVICES)
def test_userspace_rules_lead_to_the_relay_and_on_to_the_endpoints(tmp_path: Path, service: str) -> None:
    """The userspace mode's rules only redirect to its relay: explain goes on into the relay, to
    the endpoints its proxier balances the port over, which for a cluster IP (internal traffic)
    are the ones the kernel modes send to."""
    world = str(_world(tmp_path))
    relayed = _explain(service, "--manifests", world, "--proxy-mode", "userspace", *NODE)
    kernel = _destinations(_explain(service, "--manifests", world, "--proxy-mode", "iptables", *NODE))
    cluster_ips = [(p["name"], a) for p in relayed["ports"] for a in p["addresses"] if a["kind"] == "cluster IP"]
    assert cluster_ips, service
    for name, a in cluster_ips:
        assert a["relay"].startswith("192.168.0.2:"), a
        got = {(d["to"], round(d["share"], 6)) for d in a["destinations"]}
        want = kernel[(name, a["address"])]
        assert got == ({("not relayed (no endpoints)", 1.0)} if want == {("reject", 1.0)} else want), name


def test_the_expected_endpoints_and_local_policy(tmp_path: Path) -> None:
    got = _destinations(_explain("default/dns", "--port", "dns", "--manifests", str(_world(tmp_path)), *NODE))
    every = {("10.244.1.10:53", round(1 / 3, 6)), ("10.244.2.11:53", round(1 / 3, 6)), ("10.244.2.12:53", round(1 / 3, 6))}
    assert got[("default/dns:dns", "10.96.0.53:53")] == every
    # externalTrafficPolicy: Local: outside flows to the external IP and NodePort stay on this node
    assert got[("default/dns:dns", "203.0.113.53:53")] == {("10.244.1.10:53", 1.0)}
    assert got[("default/dns:dns", "192.168.0.2:30053")] == {("10.244.1.10:53", 1.0)}
    empty = _destinations(_explain("default/empty", "--manifests", str(_world(tmp_path)), *NODE))
    assert empty == {("default/empty:x", "10.96.0.82:81"): {("reject", 1.0)}}


def test_seed000_dump_alone_names_the_rules_by_their_lines() -> None:
    dump = SEED / "kube_proxy.iptables-save"
    exp = _explain("default/ares-k29-bindapp", "--port", "dns-udp-53", "--rules", str(dump),
                   "--iface", "eth3=10.5.6.29/24", "--iface", "docker0=10.100.13.1/24")
    (port,) = exp["ports"]
    assert [a["address"] for a in port["addresses"]] == ["10.24.138.29:53", "10.5.6.29:53", "203.0.113.29:53"]
    lines = dump.read_text().splitlines()
    for a in port["addresses"]:
        assert a["destinations"] == [{"to": "10.100.13.3:53", "share": 1.0, "masqueraded": True}]
        for step in a["steps"]:
            assert lines[step["line"] - 1] == step["rule"]
        assert any("ares-k29-bindapp:dns-udp-53" in s["rule"] and a["address"].split(":")[0] in s["rule"]
                   for s in a["steps"])
    assert any("read back from the proxy's own rules" in n for n in exp["notes"])


def test_a_service_the_input_does_not_have_is_said_and_exits_1(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["explain", "default/nope", "--manifests", str(_world(tmp_path)), *NODE])
    assert res.exit_code == 1 and "no port of it" in res.stdout
    bad = CliRunner().invoke(main, ["explain", "nope", "--manifests", str(_world(tmp_path))])
    assert bad.exit_code == 2 and "namespace/name" in bad.output


@pytest.mark.root
@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_what_the_kernel_holds_is_explained_as_the_render(tmp_path: Path, mode: str) -> None:
    """The render loaded into a namespace and read back with --live: the same rules in the same
    order, and the same endpoints, as the render explained."""
    world = str(_world(tmp_path))
    rendered = CliRunner().invoke(main, ["render", "--manifests", world, "--proxy-mode", mode,
                                         *(["--with-jumps"] if mode == "iptables" else []), *NODE[:4]])
    assert rendered.exit_code == 0, rendered.output
    with L.netns("kpx") as ns:
        if mode == "iptables":
            ensure_nfacct_counters(NFACCT_COUNTERS, ns)
        tool = ["iptables-restore", "--noflush"] if mode == "iptables" else ["nft", "-f", "-"]
        ns.run(tool, input=rendered.stdout)
        for service in SERVICES:
            from_render = _explain(service, "--manifests", world, "--proxy-mode", mode, *NODE)
            live = _explain(service, "--live", "--netns", ns.name, *NODE)
            assert _destinations(live) == _destinations(from_render), service
            # the kernel prints a rule in its own words (iptables-save orders the options its
            # way): the rules are compared by where they are
            steps = [[(s["table"], s["chain"]) for s in a["steps"]] for p in from_render["ports"] for a in p["addresses"]]
            assert [[(s["table"], s["chain"]) for s in a["steps"]]
                    for p in live["ports"] for a in p["addresses"]] == steps, service


@pytest.mark.root
def test_what_the_kernel_holds_in_userspace_mode_is_explained_as_the_render(tmp_path: Path) -> None:
    """The userspace render's redirects loaded into a namespace and read back with --live: the
    same rules, then the relay and its endpoints, which only the objects say (--manifests)."""
    world = str(_world(tmp_path))
    rendered = CliRunner().invoke(main, ["render", "--manifests", world, "--proxy-mode", "userspace", "--with-jumps", *NODE[:4]])
    assert rendered.exit_code == 0, rendered.output
    with L.netns("kpx") as ns:
        ns.run(["iptables-restore", "--noflush"], input=rendered.stdout)
        for service in SERVICES:
            from_render = _explain(service, "--manifests", world, "--proxy-mode", "userspace", *NODE)
            live = _explain(service, "--live", "--netns", ns.name, "--manifests", world, *NODE)
            assert _destinations(live) == _destinations(from_render), service
            relays = [a["relay"] for p in live["ports"] for a in p["addresses"]]
            assert relays and relays == [a["relay"] for p in from_render["ports"] for a in p["addresses"]], service
            assert [[(s["table"], s["chain"]) for s in a["steps"]] for p in live["ports"] for a in p["addresses"]] == \
                [[(s["table"], s["chain"]) for s in a["steps"]] for p in from_render["ports"] for a in p["addresses"]]


def _ipvs_dumps(tmp_path: Path, world: str) -> dict[str, Path]:
    """The IPVS render cut into the dumps a node gives: iptables-save (with the proxy's jumps),
    `ipset save` and `ipvsadm-save -n`."""
    rendered = CliRunner().invoke(main, ["render", "--manifests", world, "--proxy-mode", "ipvs", *NODE[:4]])
    assert rendered.exit_code == 0, rendered.output
    ipsets, rules, table = _ipvs_parts(rendered.stdout)
    out = {"iptables": _with_ipvs_jumps(rules), "ipset": ipsets, "ipvs": table}
    for name, text in out.items():
        (tmp_path / name).write_text(text)
    return {name: tmp_path / name for name in out}


def _nodeport_addresses(exp: dict[str, Any]) -> list[str]:
    return [a["address"] for p in exp["ports"] for a in p["addresses"] if a["kind"] == "node port"]


def test_ipvs_nodeports_are_explained_on_the_addresses_with_virtual_servers(tmp_path: Path) -> None:
    """In IPVS mode a NodePort answers only on the addresses the proxy made a virtual server for
    (nodePortAddresses); the pod bridge's address, without one, is not a NodePort address."""
    world = str(_world(tmp_path))
    ipvs = _explain("default/dns", "--port", "dns", "--manifests", world, "--proxy-mode", "ipvs", *NODE)
    assert _nodeport_addresses(ipvs) == ["192.168.0.2:30053"]
    iptables = _explain("default/dns", "--port", "dns", "--manifests", world, "--proxy-mode", "iptables", *NODE)
    assert _nodeport_addresses(iptables) == ["192.168.0.2:30053", "10.244.1.1:30053"]
    # the dumps decide (the Services from the objects): the same node with its NodePorts' virtual
    # servers on the bridge's address only
    dumps = _ipvs_dumps(tmp_path, world)
    moved = dumps["ipvs"].read_text().replace("192.168.0.2:", "10.244.1.1:")
    assert moved != dumps["ipvs"].read_text()
    dumps["ipvs"].write_text(moved)
    got = _explain("default/dns", "--port", "dns", "--rules", str(dumps["iptables"]), "--ipvs", str(dumps["ipvs"]),
                   "--ipset-file", str(dumps["ipset"]), "--manifests", world, *NODE)
    assert _nodeport_addresses(got) == ["10.244.1.1:30053"]
    (address,) = (a for p in got["ports"] for a in p["addresses"] if a["kind"] == "node port")
    assert [d["to"] for d in address["destinations"]] == ["10.244.1.10:53"]

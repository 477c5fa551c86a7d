"""FakeConntrack against the kernel's conntrack table: the same cleanup, the same result.

Real traffic makes the flows, in both families at once, in a client and a "node" namespace (the
bed of test_kernel.py, dual-stack here): UDP to service X by cluster IP and by NodePort (DNAT to
pod A), to Y (pod C), a TCP flow to X's cluster IP and port (DNAT to A too: same tuple fields as
a stale UDP flow, another protocol), the node's own UDP flow to an outside host on the
NodePort's number, and a UDP flow to Z's address made while Z had no endpoints (never DNATed,
[UNREPLIED]). Then X moves to pod B and one more flow goes to it.

The stale-flow cleanup then runs twice from the same starting point: on the kernel (conntrack
and `ip` in the node namespace) and on a `FakeConntrack` fed with the kernel's own
`conntrack -L` lines and local routes of both families. Both must issue the same commands, with
the same exit codes and the same entries deleted, and leave the same flows; then a second pass,
a repeated deletion and a filter of the wrong family are compared the same way. Accounting on
(`packets= bytes=` after each tuple) and off are both run: the fake must read either.

Timeouts of the node's conntrack are raised for the test (per namespace), so no entry can expire
between the snapshot and the cleanup however loaded the machine is; source ports are fixed, so
each flow is one known entry.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from kubeproxy.backends.conntrack import (
    ConntrackTable,
    Filter,
    Flow,
    NetlinkTable,
    NodePorts,
    clean_stale_entries,
    delete,
    list_flows,
    node_port_destinations,
    parse_flows,
    stale_filters,
)
from kubeproxy.backends.conntrack.fake import FakeConntrack
from kubeproxy.cluster.addresses import ip_text, valid_ip
from kubeproxy.kernel.exec import Runner
from kubeproxy.lab.netns import NetNS, link, netns
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import Family
from tests.backends.conntrack.test_kernel import ADDRS, NODE_PORT, POD_PORT, SEND, SERVER, SVC_PORT, Addrs, load

FAMILIES = (Family.IPV4, Family.IPV6)
VIP_Z = {Family.IPV4: "10.96.0.30", Family.IPV6: "fd00:96::30"}
TCP_SPORT, OWN_SPORT, Z_SPORT = 40020, 40010, 40005
STALE_SPORTS = (40001, 40004, Z_SPORT)  # X's flows to A (cluster IP, NodePort), Z's never DNATed
# Every state a flow of the test can be in (the TCP one closes): none may expire during the test.
TIMEOUTS = ("udp_timeout", "udp_timeout_stream", "tcp_timeout_time_wait", "tcp_timeout_close", "tcp_timeout_close_wait",
            "tcp_timeout_fin_wait", "tcp_timeout_last_ack", "tcp_timeout_established")  # fmt: skip

# Accepts TCP connections and answers each with the local address it reached.
TCP_SERVER = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(s.getsockname()[0].encode())
    c.close()
"""

TCP_SEND = """
import socket, sys
src, sport, dst, dport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
with socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_STREAM) as s:
    s.settimeout(5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((src, sport))
    s.connect((dst, dport))
    print(s.recv(2048).decode())
"""

# One datagram, no answer awaited: the flow is what matters (nothing listens at Z's address).
SEND_ONLY = """
import socket, sys
src, sport, dst, dport = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
with socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET, socket.SOCK_DGRAM) as s:
    s.bind((src, sport))
    s.sendto(b"probe", (dst, dport))
"""


def _udp(ns: NetNS, src: str, sport: int, dst: str, dport: int) -> str:
    return ns.run([sys.executable, "-c", SEND, src, str(sport), dst, str(dport)]).stdout.strip()


def _started(ns: NetNS, argv: list[str]) -> None:
    proc = ns.popen(argv, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"


def _await(what: str, ready: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling a condition, not a guess at how long it takes


def _flows(ns: NetNS) -> set[Flow]:
    return set(parse_flows(ns.run(["conntrack", "-L"]).stdout))


@contextmanager
def _bed(accounting: bool) -> Iterator[tuple[NetNS, NetNS]]:
    """Client and node, both families, with every flow of the module's doc made."""
    v4, v6 = ADDRS[Family.IPV4], ADDRS[Family.IPV6]
    with netns("kpctf") as client, netns("kpctf") as node:
        node.run(
            ["sysctl", "-qw", f"net.netfilter.nf_conntrack_acct={int(accounting)}"]
            + [f"net.netfilter.nf_conntrack_{name}=3600" for name in TIMEOUTS]
        )
        link(client, "eth0", f"{v4.client}/{v4.prefix}", node, "eth0", f"{v4.node}/{v4.prefix}")
        for ns, ip in ((client, v6.client), (node, v6.node)):
            # No duplicate address detection: it would hold the addresses back for a second.
            ns.run(["ip", "-6", "addr", "add", f"{ip}/{v6.prefix}", "dev", "eth0", "nodad"])
        for a in (v4, v6):
            client.run(["ip", "route", "add", a.vip_net, "via", a.node])
            host_len = 128 if a.family == Family.IPV6 else 32
            for ip in (a.pod_a, a.pod_b, a.pod_c, VIP_Z[a.family]):
                # nodad: a tentative IPv6 address cannot be bound until DAD is over.
                node.run(["ip", "addr", "add", f"{ip}/{host_len}", "dev", "lo", *(["nodad"] if host_len == 128 else [])])
        pods = [f"{ip}:{POD_PORT}" for a in (v4, v6) for ip in (a.pod_a, a.pod_b, a.pod_c)]
        _started(node, [sys.executable, "-c", SERVER, *pods])
        _started(client, [sys.executable, "-c", SERVER, f"{v4.client}:{NODE_PORT}", f"{v6.client}:{NODE_PORT}"])
        for a in (v4, v6):
            _started(node, [sys.executable, "-c", TCP_SERVER, a.pod_a, str(POD_PORT)])
            _flows_of(client, node, a)
        # eth0's link-local address gets its local route only after duplicate address detection
        # (a second or two): the kernel and the fake must be asked about the same local routes.
        _await("the node's link-local address", lambda: any(dst.startswith("fe80:") for dst in _local_routes(node)))
        yield client, node


def _local_routes(ns: NetNS) -> list[str]:
    argvs = (["ip", "-j", v, "route", "show", "table", "local", "type", "local"] for v in ("-4", "-6"))
    return [r["dst"] for argv in argvs for r in json.loads(ns.run(argv).stdout)]


def _tcp_rule(a: Addrs) -> list[str]:
    tool = "ip6tables" if a.family == Family.IPV6 else "iptables"
    to = f"[{a.pod_a}]:{POD_PORT}" if a.family == Family.IPV6 else f"{a.pod_a}:{POD_PORT}"
    return [tool, "-t", "nat", "-A", "PREROUTING", "-d", a.vip_x, "-p", "tcp", "--dport", str(SVC_PORT), "-j", "DNAT",
            "--to-destination", to]  # fmt: skip


def _flows_of(client: NetNS, node: NetNS, a: Addrs) -> None:
    load(node, a, a.pod_a)
    node.run(_tcp_rule(a))
    assert _udp(client, a.client, 40001, a.vip_x, SVC_PORT) == a.pod_a
    assert _udp(client, a.client, 40004, a.node, NODE_PORT) == a.pod_a
    assert _udp(client, a.client, 40002, a.vip_y, SVC_PORT) == a.pod_c
    tcp = client.run([sys.executable, "-c", TCP_SEND, a.client, str(TCP_SPORT), a.vip_x, str(SVC_PORT)]).stdout.strip()
    assert tcp == a.pod_a
    assert _udp(node, a.node, OWN_SPORT, a.client, NODE_PORT) == a.client  # the node's own flow out
    client.run([sys.executable, "-c", SEND_ONLY, a.client, str(Z_SPORT), VIP_Z[a.family], str(SVC_PORT)])
    # The datagram to Z is not answered: await its entry instead of a reply.
    _await(f"the flow to {VIP_Z[a.family]}", lambda: any(f.orig_sport == Z_SPORT and f.orig_dst == VIP_Z[a.family]
                                                        for f in _flows(node)))  # fmt: skip
    load(node, a, a.pod_b)  # the sync that moved X to pod B (the TCP flow stays pinned to A)
    assert _udp(client, a.client, 40003, a.vip_x, SVC_PORT) == a.pod_b


def _view(a: Addrs) -> NodeView:
    """X's only endpoint is B, Y's C, Z (a UDP service that got its first endpoint) C."""
    ip = valid_ip
    names = {n: ServicePortName("default", n, "dns", "UDP") for n in ("x", "y", "z")}
    return NodeView(
        services={
            names["x"]: ServicePortInfo(names["x"], ip(a.vip_x), SVC_PORT, "UDP", node_port=NODE_PORT),
            names["y"]: ServicePortInfo(names["y"], ip(a.vip_y), SVC_PORT, "UDP"),
            names["z"]: ServicePortInfo(names["z"], ip(VIP_Z[a.family]), SVC_PORT, "UDP"),
        },
        endpoints={
            names["x"]: [EndpointInfo(ip_text(valid_ip(a.pod_b)), POD_PORT)],
            names["y"]: [EndpointInfo(ip_text(valid_ip(a.pod_c)), POD_PORT)],
            names["z"]: [EndpointInfo(ip_text(valid_ip(a.pod_c)), POD_PORT)],
        },
    )


# ------------------------------------------------------------------ one tool, two implementations


@dataclass
class _Recorder:
    """A runner that passes commands on and keeps (argv, exit code, flows printed) of each."""

    run: Runner
    seen: list[tuple[list[str], int, frozenset[Flow] | str]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        proc = self.run(argv, **kw)
        # Flows are compared as flows: the lines also carry timeouts and counters, which differ.
        out: frozenset[Flow] | str = frozenset(parse_flows(proc.stdout)) if argv[0] == "conntrack" else _routes(proc.stdout)
        self.seen.append((list(argv), proc.returncode, out))
        return proc


def _routes(stdout: str) -> str:
    try:
        return json.dumps(sorted(r["dst"] for r in json.loads(stdout)))
    except ValueError:
        return stdout


@dataclass
class _Tool:
    """The node's conntrack and `ip`, on the kernel or on a FakeConntrack."""

    run: Runner
    remaining: Callable[[], set[Flow]]


def _kernel(node: NetNS) -> _Tool:
    return _Tool(node, lambda: _flows(node))


def _fake(node: NetNS) -> _Tool:
    """A FakeConntrack holding what the kernel holds now: its `conntrack -L` lines, local routes."""
    lines = [line for line in node.run(["conntrack", "-L"]).stdout.splitlines() if line.strip()]
    fake = FakeConntrack(table=lines, local=_local_routes(node))
    return _Tool(fake, lambda: set(parse_flows(fake.table)))


NODE_PORTS = {
    "all-local": lambda a: NodePorts(),
    "nodeport-addresses": lambda a: NodePorts(ips=(a.node,), all_local=False),
}


def _program_cleanup(view: NodeView, family: str, run: Runner, node_ports: NodePorts) -> int:
    """The cleanup's selection carried out with the conntrack program (`Filter.argv`)."""
    flows = list_flows(family, run)
    destinations = node_port_destinations(view, family, node_ports, run)
    return sum(delete(flt, family, run) for flt in stale_filters(flows, view, destinations))


def _cleanup(tool: _Tool, node_ports: str) -> list[Any]:
    """The cleanup through the conntrack program for each family, then the commands an operator
    could issue next; what was seen."""
    seen: list[Any] = []
    for family in FAMILIES:
        a = ADDRS[family]
        rec = _Recorder(tool.run)
        deleted = _program_cleanup(_view(a), family, rec, NODE_PORTS[node_ports](a))
        seen.append((family, "cleanup", deleted, rec.seen, tool.remaining()))
        rec = _Recorder(tool.run)
        again = _program_cleanup(_view(a), family, rec, NODE_PORTS[node_ports](a))
        seen.append((family, "second pass", again, rec.seen, tool.remaining()))
        # A filter whose entries are gone already (deleted by another pass): nothing, exit 1.
        rec = _Recorder(tool.run)
        gone = delete(Filter(SVC_PORT, a.pod_a, POD_PORT, a.vip_x), family, rec)
        seen.append((family, "gone", gone, rec.seen, tool.remaining()))
        # The other family's address under this family's -f: a usage error (exit 2).
        other = ADDRS[Family.IPV6 if family == Family.IPV4 else Family.IPV4]
        proc = tool.run(["conntrack", "-D", *Filter(SVC_PORT, a.pod_c, POD_PORT, other.vip_y).argv(family)], check=False)
        seen.append((family, "mismatched family", proc.returncode, tool.remaining()))
        # Addresses and ports spelled otherwise select as addresses and numbers: Y's flow goes.
        spelled = ["--orig-dst", ipaddress.ip_address(a.vip_y).exploded, "--orig-port-dst", f"0{SVC_PORT}",
                   "--reply-src", ipaddress.ip_address(a.pod_c).exploded, "--reply-port-src", str(POD_PORT)]  # fmt: skip
        rec = _Recorder(tool.run)
        rec(["conntrack", "-D", "-p", "udp", "-f", "ipv6" if family == Family.IPV6 else "ipv4", *spelled], check=False)
        seen.append((family, "spelled otherwise", rec.seen, tool.remaining()))
    return seen


@pytest.mark.root
@pytest.mark.parametrize("accounting", [False, True], ids=["no-accounting", "accounting"])
@pytest.mark.parametrize("node_ports", sorted(NODE_PORTS))
def test_the_fake_cleans_up_as_the_kernel_does(accounting: bool, node_ports: str) -> None:
    with _bed(accounting) as (_, node):
        fake = _fake(node)
        before = _flows(node)
        on_kernel = _cleanup(_kernel(node), node_ports)
    on_fake = _cleanup(fake, node_ports)
    assert len(on_kernel) == len(on_fake)
    for got, want in zip(on_fake, on_kernel, strict=True):
        assert got == want, f"{want[0]} {want[1]}: the fake differs from the kernel"
    # Not a vacuous comparison: the stale flows went and everything else stayed, on both.
    stale = {f for f in before if f.protocol == "udp" and f.orig_sport in STALE_SPORTS}
    for family in FAMILIES:
        ours = {f for f in stale if f.orig_src == ADDRS[family].client}
        assert len(ours) == 3, ours
        _, _, deleted, commands, remaining = next(s for s in on_kernel if s[:2] == (family, "cleanup"))
        assert deleted == 3 and not ours & remaining
        assert {rc for argv, rc, _ in commands if argv[1] == "-D"} == {0}
    last = on_kernel[-1][-1]
    assert last == before - stale - {f for f in before if f.protocol == "udp" and f.orig_sport == 40002}
    assert any(f.protocol == "tcp" and f.orig_sport == TCP_SPORT for f in last)  # the TCP flow survived


# ------------------------------------------------------------------ the same, over ctnetlink


def _no_program(argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    raise AssertionError(f"the reconciler ran {argv[0]}")  # only `ip` is expected, and only when asked for


def _netlink_cleanup(table: ConntrackTable, node: NetNS, node_ports: str) -> list[Any]:
    """The proxy's cleanup for each family on `table`, then deletions it could be asked for next."""
    seen: list[Any] = []
    for family in FAMILIES:
        a = ADDRS[family]
        ports = NODE_PORTS[node_ports](a)
        # `ip` answers from the node (the same local routes for both tables); nothing else runs.
        run: Runner = node if ports.all_local else _no_program
        listed = frozenset(table.udp_flows(family))
        deleted = clean_stale_entries(_view(a), family, run, node_ports=ports, table=table)
        seen.append((family, "cleanup", listed, deleted, frozenset(table.udp_flows(family))))
        again = clean_stale_entries(_view(a), family, run, node_ports=ports, table=table)
        seen.append((family, "second pass", again, frozenset(table.udp_flows(family))))
        # A flow already gone, and a flow of the other family: nothing to delete, not an error.
        gone = next(f for f in listed if f.orig_sport == 40001)
        other = next(iter(table.udp_flows(Family.IPV6 if family == Family.IPV4 else Family.IPV4)))
        table.udp_flows(family)
        seen.append((family, "gone and other family", table.delete_flows(family, [gone, other])))
        # Y's flow, asked for by itself: it goes.
        y = next(f for f in table.udp_flows(family) if f.orig_sport == 40002)
        seen.append((family, "one flow", table.delete_flows(family, [y]), frozenset(table.udp_flows(family))))
    return seen


@pytest.mark.root
@pytest.mark.parametrize("node_ports", sorted(NODE_PORTS))
def test_the_fake_table_cleans_up_as_the_kernels_over_ctnetlink(node_ports: str) -> None:
    with _bed(accounting=False) as (_, node):
        fake = FakeConntrack(table=[line for line in node.run(["conntrack", "-L"]).stdout.splitlines() if line.strip()])
        before = _flows(node)
        kernel = NetlinkTable(node.netns_path)
        try:
            on_kernel = _netlink_cleanup(kernel, node, node_ports)
        finally:
            kernel.close()
        after = _flows(node)  # read by the conntrack program: an oracle independent of ours
        on_fake = _netlink_cleanup(fake, node, node_ports)
    assert len(on_kernel) == len(on_fake)
    for got, want in zip(on_fake, on_kernel, strict=True):
        assert got == want, f"{want[0]} {want[1]}: the fake differs from the kernel"
    # Not vacuous: the stale flows and Y's went and everything else stayed, as the program sees it.
    for family in FAMILIES:
        _, _, listed, deleted, _ = next(s for s in on_kernel if s[:2] == (family, "cleanup"))
        assert deleted == 3 and {f.orig_sport for f in listed} >= {*STALE_SPORTS, 40002, 40003, OWN_SPORT}
        assert all(f.protocol == "udp" for f in listed)
    gone = {f for f in before if f.protocol == "udp" and f.orig_sport in (*STALE_SPORTS, 40002)}
    assert after == before - gone
    assert any(f.protocol == "tcp" and f.orig_sport == TCP_SPORT for f in after)  # the TCP flow survived


# ------------------------------------------------------------------ without root

# `conntrack -L` in the node namespace of the test above, accounting on (IPv4 and IPv6 lines mixed)
CAPTURED = """\
udp      17 3599 src=10.0.0.2 dst=10.0.0.1 sport=40004 dport=30053 packets=1 bytes=33 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40004 packets=1 bytes=38 mark=0 use=1
udp      17 3599 src=fd00::2 dst=fd00:96::10 sport=40001 dport=53 packets=1 bytes=53 src=fd00:244::1 dst=fd00::2 sport=5300 dport=40001 packets=1 bytes=59 mark=0 use=1
udp      17 3599 src=10.0.0.2 dst=10.96.0.10 sport=40001 dport=53 packets=1 bytes=33 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40001 packets=1 bytes=38 mark=0 use=1
udp      17 3599 src=10.0.0.2 dst=10.96.0.30 sport=40005 dport=53 packets=1 bytes=33 [UNREPLIED] src=10.96.0.30 dst=10.0.0.2 sport=53 dport=40005 packets=0 bytes=0 mark=0 use=1
tcp      6 3599 TIME_WAIT src=10.0.0.2 dst=10.96.0.10 sport=40020 dport=53 packets=4 bytes=216 src=10.244.1.1 dst=10.0.0.2 sport=5300 dport=40020 packets=4 bytes=226 [ASSURED] mark=0 use=1
udp      17 3599 src=10.0.0.1 dst=10.0.0.2 sport=40010 dport=30053 packets=1 bytes=33 src=10.0.0.2 dst=10.0.0.1 sport=30053 dport=40010 packets=1 bytes=36 mark=0 use=1
udp      17 3599 src=10.0.0.2 dst=10.96.0.10 sport=40003 dport=53 packets=1 bytes=33 src=10.244.2.2 dst=10.0.0.2 sport=5300 dport=40003 packets=1 bytes=38 mark=0 use=1
udp      17 3599 src=10.0.0.2 dst=10.96.0.20 sport=40002 dport=53 packets=1 bytes=33 src=10.244.3.3 dst=10.0.0.2 sport=5300 dport=40002 packets=1 bytes=38 mark=0 use=1
"""  # noqa: E501
LOCAL = ["10.0.0.1", "127.0.0.0/8", "127.0.0.1", "fd00::1", "::1"]  # both families, as the kernel's


def test_the_fake_answers_what_the_kernel_answered() -> None:
    """The kernel's answers to these commands, on the lines above, from the root test's runs."""
    fake = FakeConntrack(table=CAPTURED.splitlines(), local=LOCAL)
    listed = fake(["conntrack", "-L", "-p", "udp", "-f", "ipv4"])
    assert listed.stderr == "conntrack v1.4.7 (conntrack-tools): 6 flow entries have been shown.\n"
    assert {f.orig_sport for f in parse_flows(listed.stdout)} == {40004, 40001, 40005, 40010, 40003, 40002}
    routes = json.loads(fake(["ip", "-j", "-6", "route", "show", "table", "local", "type", "local"]).stdout)
    assert [r["dst"] for r in routes] == ["fd00::1", "::1"]

    a = ADDRS[Family.IPV4]
    assert _program_cleanup(_view(a), Family.IPV4, fake, NodePorts()) == 3  # X's to A (two), Z's never DNATed
    assert {(f.protocol, f.orig_sport) for f in parse_flows(fake.table)} == {
        ("udp", 40001), ("tcp", 40020), ("udp", 40010), ("udp", 40003), ("udp", 40002),  # 40001: IPv6
    }  # fmt: skip
    flt = Filter(SVC_PORT, a.pod_a, POD_PORT, a.vip_x).argv(Family.IPV4)
    again = fake(["conntrack", "-D", *flt], check=False)
    assert (again.returncode, again.stdout) == (1, "")
    assert again.stderr == "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n"
    other = fake(["conntrack", "-D", *Filter(53, "fd00:244::1", 5300, "fd00:96::10").argv(Family.IPV4)], check=False)
    assert other.returncode == 2 and "mismatched address family" in other.stderr
    six = fake(["conntrack", "-D", "-p", "udp", "-f", "ipv6", "--orig-dst", "fd00:96:0:0::10", "--orig-port-dst", "053"])
    assert [f.orig_sport for f in parse_flows(six.stdout)] == [40001]

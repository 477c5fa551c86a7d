"""The kernel-differential harness over the corpus of real dumps (tests/netfilter/corpus/).

Per dump: a node namespace with the dump loaded as its era says (iptables-legacy-restore,
iptables-nft-restore or nft), a client on its front interface and a namespace of pods behind its
pod interface; probes chosen from the dump's own services (a ClusterIP from a pod and from
outside, from the node itself, a NodePort, a service without endpoints, the neighbours' rules);
each probe's first packets are observed one way (sniffers on the wire, listeners for local
delivery, the sender's ICMP errors) and compared with the tracer's outcomes.

A dump is a public excerpt more often than a whole ruleset: chains it uses but does not show are
declared empty when it is loaded, and the tracer's outcomes are read with those chains returning
(they are "unknown" to the tracer, which covers both answers).
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kubeproxy.lab import netns as L
from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter import detect
from kubeproxy.netfilter.node import Node
from kubeproxy.netfilter.packet import make_packet
from kubeproxy.netfilter.ruleset import (
    Addr,
    CtState,
    Iface,
    Jump,
    Mark,
    Nat,
    NConst,
    NMatch,
    NPayload,
    Port,
    Proto,
    Ruleset,
    SetMark,
    SetMatch,
    Verdict,
)
from kubeproxy.netfilter.simulate import Outcome, trace

CORPUS = Path(__file__).parent / "corpus"
WIRE = [sys.executable, str(Path(__file__).parent / "wire.py")]
FRONT, CLIENT_IF = "eth0", "eth0"
MARK_PORT = 9  # the first source port of the markers that end a watch (probes use 41000 on)
BUILTIN_TARGETS = {"ACCEPT", "DROP", "RETURN", "REJECT", "DNAT", "SNAT", "MASQUERADE", "REDIRECT", "MARK",
                   "CONNMARK", "LOG", "NFLOG", "ULOG", "CHECKSUM", "TCPMSS", "NOTRACK", "CT", "TRACE", "QUEUE",
                   "NFQUEUE", "AUDIT", "TTL", "HL", "DSCP", "TOS", "CLASSIFY", "SECMARK", "CONNSECMARK", "SET"}


@dataclass
class Entry:
    name: str
    path: Path
    fmt: str
    meta: dict[str, Any]

    @property
    def text(self) -> str:
        return self.path.read_text()


def entries() -> list[Entry]:
    out = []
    for p in sorted(CORPUS.iterdir()):
        if p.suffix == ".yaml":
            continue
        fmt = {".iptables-save": "iptables-save", ".iptables-list": "iptables-list", ".nft": "nft"}[p.suffix]
        meta = yaml.safe_load(p.with_suffix(".yaml").read_text())
        out.append(Entry(p.stem, p, fmt, meta))
    return out


# --------------------------------------------------------------------------- loading
def restorable(text: str) -> str:
    """iptables-save text the kernel accepts: a header for `iptables -S` output, COMMIT after
    each table, and every chain the rules use but the excerpt does not declare, declared empty."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if not any(ln.startswith("*") for ln in lines):
        lines = ["*filter", *lines, "COMMIT"]
    out: list[str] = []
    tables: list[list[str]] = []
    for ln in lines:
        if ln.startswith("*"):
            tables.append([ln])
        elif tables:
            tables[-1].append(ln)
    for t in tables:
        body = [ln for ln in t[1:] if ln != "COMMIT"]
        body = [re.sub(r"^\[\d+:\d+\] ", "", ln) for ln in body]
        declared = {ln[1:].split()[0] for ln in body if ln.startswith(":")}
        body = [f"-P {ln[3:]}" if ln.startswith("-P ") else ln for ln in body]
        policies = [ln for ln in body if ln.startswith("-P ")]
        used: list[str] = []
        for ln in body:
            m = re.match(r"-[AN] (\S+)", ln)
            if m:
                used.append(m.group(1))
            m = re.search(r" -[jg] (\S+)", ln)
            if m and m.group(1) not in BUILTIN_TARGETS:
                used.append(m.group(1))
        builtin = {"PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"}
        missing = [c for c in dict.fromkeys(used) if c not in declared and c not in builtin]
        decls = [f":{c} - [0:0]" for c in missing]
        pol = [f":{p.split()[1]} {p.split()[2]} [0:0]" for p in policies]
        rules = [ln for ln in body if not ln.startswith(("-P ", "-N "))]
        out += [t[0], *pol, *decls, *rules, "COMMIT"]
    return "\n".join(out) + "\n"


def completed(text: str) -> str:
    """An excerpt of kube-proxy's nat table that shows KUBE-SERVICES but not the hooks into it
    (the excerpt was cut above them) gets kube-proxy's own hooks back, so that probes reach the
    rules shown; the same text goes to the kernel and to the tracer."""
    m = re.search(r"^\*nat$(.*?)^COMMIT$", text, re.M | re.S)
    if m is None or "-A KUBE-SERVICES " not in m.group(1) or "-j KUBE-SERVICES" in m.group(1):
        return text
    hooks = ('-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\n'
             '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\n')
    return text[: m.end(1)] + hooks + text[m.end(1) :]


def listing_to_save(rs: Ruleset) -> str:
    """iptables-save text for the kernel from a parsed `iptables -L` listing (the listing itself
    is not restore input). The tracer reads the listing; the kernel gets these rules. Raises
    ValueError for a step this writer does not know (the dump is then not loaded)."""
    out: list[str] = []
    for t in rs.tables:
        out.append(f"*{t.name}")
        for name, ch in t.chains.items():
            out.append(f":{name} {ch.policy or ('ACCEPT' if ch.hook else '-')} [0:0]")
        for name, ch in t.chains.items():
            for r in ch.rules:
                out.append(f"-A {name} " + " ".join(_step_text(s) for s in r.load()))
        out.append("COMMIT")
    return "\n".join(out) + "\n"


def _step_text(s: object) -> str:
    no = "! " if getattr(s, "neg", False) else ""
    if isinstance(s, Addr):
        return f"{no}-{'s' if s.field == 'src' else 'd'} {A.fmt_cidr(s.net, s.mask, s.v6)}"
    if isinstance(s, Iface):
        return f"{no}-{'i' if s.field == 'in' else 'o'} {s.name}{'+' if s.prefix else ''}"
    if isinstance(s, Proto):
        return f"{no}-p {s.proto}"
    if isinstance(s, Port):
        ports = ",".join(f"{lo}:{hi}" if hi != lo else str(lo) for lo, hi in s.ranges)
        flag = {"dport": "--dports", "sport": "--sports", "any": "--ports"}[s.field]
        return f"-m multiport {no}{flag} {ports}"
    if isinstance(s, CtState):
        status = sorted(x[7:] for x in s.states if x.startswith("STATUS_"))
        states = sorted(x for x in s.states if not x.startswith("STATUS_"))
        if status and states:
            raise ValueError(f"mixed ctstate/ctstatus {s}")
        return f"-m conntrack {no}--ctstatus {','.join(status)}" if status else f"-m conntrack {no}--ctstate {','.join(states)}"
    if isinstance(s, Mark):
        return f"-m {'connmark' if s.conn else 'mark'} {no}--mark {s.value:#x}/{s.mask:#x}"
    if isinstance(s, Verdict) and s.kind in ("ACCEPT", "DROP", "RETURN"):
        return f"-j {s.kind}"
    if isinstance(s, Verdict) and s.kind == "REJECT":
        return f"-j REJECT --reject-with {s.detail or 'icmp-port-unreachable'}"
    if isinstance(s, Jump):
        return f"-{'g' if s.goto else 'j'} {s.chain}"
    if isinstance(s, Nat) and s.kind == "masquerade" and s.port is None:
        return "-j MASQUERADE"
    if isinstance(s, Nat) and s.kind == "dnat" and isinstance(s.addr, int):
        return f"-j DNAT --to-destination {A.fmt_ip(s.addr)}" + (f":{s.port}" if s.port else "")
    if isinstance(s, SetMark) and not s.conn:
        return f"-j MARK --set-xmark {s.xor_value:#x}/{~s.and_mask & 0xFFFFFFFF:#x}"
    raise ValueError(f"cannot write {s!r} back as a rule")


def loader_of(entry: Entry) -> str:
    if entry.fmt == "iptables-list":
        return "iptables-legacy-restore"  # the rules the listing shows, written back
    if entry.fmt == "nft":
        return "nft"
    want = str(entry.meta.get("loader", ""))
    return "iptables-nft-restore" if "nft" in want else "iptables-legacy-restore"


# --------------------------------------------------------------------------- probes
@dataclass(frozen=True)
class Probe:
    kind: str  # what it exercises
    proto: str
    sender: str  # client, pod, node
    dst: str
    dport: int


@dataclass
class Plan:
    node_ip: str
    pod_net: str  # CIDR
    back_if: str
    endpoints: list[str]
    probes: list[Probe]


def _rules(rs: Ruleset) -> list[tuple[str, str, list[object]]]:
    out = []
    for t in rs.tables:
        for c in t.chains.values():
            for r in c.rules:
                out.append((t.name, c.name, r.load()))
    return out


def _nft_match(steps: list[object]) -> tuple[str | None, str | None, int | None]:
    """(destination address, protocol, destination port) an nft rule matches exactly, if any:
    `ip daddr A`, `tcp|udp dport P`."""
    dst = proto = port = None
    for s in steps:
        if not (isinstance(s, NMatch) and s.op == "==" and isinstance(s.left, NPayload) and isinstance(s.right, NConst)):
            continue
        if s.left.proto == "ip" and s.left.field == "daddr" and isinstance(s.right.value, int):
            dst = A.fmt_ip(s.right.value)
        elif s.left.proto in ("tcp", "udp") and s.left.field == "dport" and isinstance(s.right.value, int):
            proto, port = s.left.proto, s.right.value
    return dst, proto, port


def _declared_probes(meta: dict[str, Any]) -> list[Probe]:
    """Probes an entry's header names (`probes: [[kind, proto, sender, dst, dport], ...]`): the
    dump's own services that its rules' shape does not show the planner."""
    return [Probe(str(k), str(pr), str(who), str(dst), int(port)) for k, pr, who, dst, port in meta.get("probes", [])]


def plan(rs: Ruleset, text: str, meta: dict[str, Any] | None = None) -> Plan:
    """Addresses for the bed and the probes, from what the dump says (and its header's
    `node_ip`, `pod_net`, `back_if` and `probes`, where the rules alone do not say)."""
    meta = meta or {}
    rules = _rules(rs)
    endpoints: list[str] = []
    node_ip = ""
    for _t, _c, steps in rules:
        for s in steps:
            if isinstance(s, Nat) and s.kind == "dnat" and isinstance(s.addr, int) and not s.v6:
                ip = A.fmt_ip(s.addr)
                if ip not in endpoints:
                    endpoints.append(ip)
    m = re.search(r'default/kubernetes:?[a-z]*"? -m tcp -j DNAT --to-destination (\d+\.\d+\.\d+\.\d+)', text) or \
        re.search(r"default/kubernetes:https -> (\d+\.\d+\.\d+\.\d+):", text)
    if m:
        node_ip = m.group(1)  # the API server's address: this node is the control plane
    pod_net = ""
    m = re.search(r"! -s (\d+\.\d+\.\d+\.\d+/\d+) -d \S+ -p \S+ -m comment", text) or \
        re.search(r"ip saddr != (\d+\.\d+\.\d+\.\d+/\d+)", text) or \
        re.search(r"-s (10\.\d+\.0\.0/16) ", text)
    pod_net = str(meta.get("pod_net", m.group(1) if m else "10.244.0.0/16"))
    node_ip = str(meta.get("node_ip", node_ip or "192.0.2.10"))
    endpoints = [e for e in endpoints if e != node_ip]
    names = " ".join(c for _t, c, _s in rules) + " " + text
    back_if = str(meta.get("back_if") or next((n for n in ("weave", "cni0", "docker0", "cbr0", "virbr0")
                                                if f"-o {n} " in names or f'oifname "{n}"' in names), "cni0"))
    probes: list[Probe] = []
    seen: set[tuple[str, int, str]] = set()
    nodeport_ports: list[tuple[str, int]] = []
    noeps: list[tuple[str, str, int]] = []
    services: list[tuple[str, str, int]] = []
    for _t, c, steps in rules:
        dst = next((s for s in steps if isinstance(s, Addr) and s.field == "dst" and not s.neg
                    and s.mask == A.ALL4 and not s.v6), None)
        proto = next((s for s in steps if isinstance(s, Proto) and not s.neg), None)
        port = next((s for s in steps if isinstance(s, Port) and s.field == "dport" and not s.neg), None)
        last = steps[-1] if steps else None
        pname = A.PROTO_NAMES.get(proto.proto) if proto else None
        ndst, nproto, nport = _nft_match(steps)
        if nproto is not None and nport is not None:
            # an nft rule: a service (KUBE-SERVICES' jump per address and port) or a published
            # port (a DNAT by port alone: NodePorts, hostports, Docker's published ports)
            if ndst is not None and c == "KUBE-SERVICES" and isinstance(last, Jump):
                services.append((ndst, nproto, nport))
            elif ndst is None and any(isinstance(s, Nat) and s.kind == "dnat" for s in steps):
                nodeport_ports.append((nproto, nport))
            continue
        if pname not in ("tcp", "udp") or port is None:
            continue
        p = port.ranges[0][0]
        if dst is not None and isinstance(last, Verdict) and last.kind == "REJECT":
            noeps.append((A.fmt_ip(dst.net), pname, p))
        elif dst is not None and c in ("KUBE-SERVICES",) and (isinstance(last, Jump) or type(last).__name__ == "UnknownTarget"):
            services.append((A.fmt_ip(dst.net), pname, p))
        elif dst is None and c in ("KUBE-NODEPORTS", "KUBE-EXTERNAL-SERVICES", "KUBE-SERVICES"):
            nodeport_ports.append((pname, p))
    for ip, pr, p in services[:2]:
        if (ip, p, pr) not in seen:
            seen.add((ip, p, pr))
            probes.append(Probe("ClusterIP from a pod", pr, "pod", ip, p))
    if services:
        ip, pr, p = services[0]
        probes.append(Probe("ClusterIP from outside", pr, "client", ip, p))
        probes.append(Probe("ClusterIP from the node", pr, "node", ip, p))
        for ip2, pr2, p2 in services:
            if p2 == 443 and ip2.endswith(".1") and (ip2, pr2, p2) != services[0]:
                probes.append(Probe("kubernetes service from the node", pr2, "node", ip2, p2))
                break
    for pr, p in nodeport_ports[:1]:
        probes.append(Probe("NodePort from outside", pr, "client", node_ip, p))
    if rs.source == "nft":
        # a packet the node sends itself has no input interface: `iifname != X` matches it
        for pr, p in nodeport_ports[:1]:
            probes.append(Probe("NodePort from the node", pr, "node", node_ip, p))
        for pr, p in nodeport_ports[:1]:
            probes.append(Probe("NodePort from a pod", pr, "pod", node_ip, p))
    probes += _declared_probes(meta)
    for ip, pr, p in noeps[:1]:
        probes.append(Probe("no endpoints, from a pod", pr, "pod", ip, p))
    pod_dst = _pod_ip(pod_net, 7)
    probes.append(Probe("neighbours: forwarded to a pod", "tcp", "client", pod_dst, 80))
    probes.append(Probe("neighbours: forwarded to a pod", "udp", "client", pod_dst, 53))
    probes.append(Probe("neighbours: to the node", "tcp", "client", node_ip, 22))
    probes.append(Probe("neighbours: pod to outside", "udp", "pod", _client_ip(node_ip), 9999))
    return Plan(node_ip, pod_net, back_if, endpoints, probes)


def _pod_ip(pod_net: str, host: int) -> str:
    net, mask, _ = A.parse_cidr(pod_net)
    # in the pod network, off its first /24 when it is wider than a /22 (a /24 bridge network
    # of libvirt or LXD: in it)
    return A.fmt_ip(net + (256 * 3 if bin(mask).count("1") <= 22 else 0) + host)


def _client_ip(node_ip: str) -> str:
    ip = A.parse_ip(node_ip)[0]
    return A.fmt_ip((ip & ~0xFF) | (250 if (ip & 0xFF) != 250 else 251))


# --------------------------------------------------------------------------- running
@dataclass
class ProbeResult:
    probe: Probe
    agrees: bool
    predicted: set[object]
    observed: list[object]
    unknown: bool  # the tracer met an unknown match (its outcomes cover both answers)


@dataclass
class DumpResult:
    entry: Entry
    skipped: str = ""
    probes: list[ProbeResult] = field(default_factory=list)
    loader: str = ""  # what loaded it into the kernel


def _expect(o: Outcome, front_if: str, back_if: str) -> object:
    if o.verdict == "DROP":
        return "timeout"
    if o.verdict == "REJECT":
        return "refused"
    if o.verdict != "ACCEPT":
        return o.verdict
    key = (A.fmt_ip(o.dst), o.dport, A.fmt_ip(o.src))
    if o.local:
        return ("node", *key)
    if o.out_iface == front_if:
        return ("client", *key)
    if o.out_iface == back_if:
        return ("pods", *key)
    return "timeout"


def run(entry: Entry, count: int = 3, *, listed_by_nft: bool = False) -> DumpResult:
    """The dump's probes, traced and sent. `listed_by_nft`: an iptables dump is loaded with
    iptables-nft-restore and the tracer reads the kernel's `nft list ruleset` of it instead (an
    iptables-nft node as nft prints it: statistic as `meta random`, what nft cannot translate as
    `# xt_NAME`)."""
    loader = "iptables-nft-restore" if listed_by_nft and entry.fmt != "nft" else loader_of(entry)
    res = DumpResult(entry, loader=loader + (", traced from nft's listing" if listed_by_nft else ""))
    with ExitStack() as stack:
        node = stack.enter_context(L.netns("kcn"))
        text = completed(entry.text) if entry.fmt == "iptables-save" else entry.text
        if entry.fmt == "iptables-list":
            rs = detect.parse(text)
            try:
                text = listing_to_save(rs)
            except ValueError as e:
                res.skipped = f"listing not written back: {e}"
                return res
        elif loader == "nft":
            got = node.run(["nft", "-f", "-"], input=text, check=False)
            if got.returncode != 0:
                res.skipped = f"nft could not load it: {got.stderr.strip()[:200]}"
                return res
            rs = detect.parse(node.run(["nft", "-j", "list", "ruleset"]).stdout)
        else:
            rs = detect.parse(text)
        p = plan(rs, text, entry.meta)
        client = stack.enter_context(L.netns("kcc"))
        pods = stack.enter_context(L.netns("kcp"))
        client_ip = _client_ip(p.node_ip)
        L.link(client, CLIENT_IF, f"{client_ip}/24", node, FRONT, f"{p.node_ip}/24")
        back_ip = _pod_ip(p.pod_net, 1)
        L.link(node, p.back_if, f"{back_ip}/24", pods, "eth0", f"{_pod_ip(p.pod_net, 9)}/24")
        pod_src = _pod_ip(p.pod_net, 9)
        extra = [_pod_ip(p.pod_net, 7), *p.endpoints]
        for ip in dict.fromkeys(extra):
            if ip not in (pod_src, back_ip):
                pods.run(["ip", "addr", "add", f"{ip}/32", "dev", "eth0"])
                node.run(["ip", "route", "replace", f"{ip}/32", "dev", p.back_if])
        client.run(["ip", "route", "add", "default", "via", p.node_ip])
        pods.run(["ip", "route", "add", "default", "via", back_ip])
        node.run(["ip", "route", "add", "default", "via", client_ip])
        node.run(["sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv4.icmp_ratelimit=0",
                  "net.ipv4.icmp_msgs_per_sec=100000", "net.ipv4.icmp_msgs_burst=100000"])
        if loader != "nft":
            restore = restorable(text)
            for name in sorted({s.name for _t, _c, st in _rules(rs) for s in st if isinstance(s, SetMatch)}):
                node.run(["ipset", "create", name, "hash:net"], check=False)
            got = node.run([loader], input=restore, check=False)
            if got.returncode != 0:
                res.skipped = f"{loader} refused it: {got.stderr.strip()[:200]}"
                return res
            if listed_by_nft:
                # as a user posts it: the text (its JSON names xt matches without their options)
                rs = detect.parse(node.run(["nft", "list", "ruleset"]).stdout)
        model = Node.from_flags(ifaces=[f"{FRONT}={p.node_ip}/24", f"{p.back_if}={back_ip}/24"],
                                routes=[f"default={FRONT}@{client_ip}",
                                        *(f"{ip}/32={p.back_if}" for ip in dict.fromkeys(extra) if ip != back_ip)])
        senders = {"client": (client, client_ip, FRONT), "pod": (pods, pod_src, p.back_if),
                   "node": (node, p.node_ip, None)}
        # predictions first: they say where listeners for local delivery are needed
        predictions: list[tuple[Probe, set[object], bool]] = []
        local: dict[str, set[str]] = {"tcp": set(), "udp": set()}
        for pr in p.probes:
            _ns, src, in_if = senders[pr.sender]
            tr = trace(rs, model, make_packet(pr.proto, f"{src}:40000", f"{pr.dst}:{pr.dport}", in_iface=in_if))
            keys = tr.unknowns()
            answers = {k: ("returns" if k[4].startswith("chain") else "continues") for k in keys}
            outs = tr.given({k: v for k, v in answers.items() if not k[4].startswith(("-m", "xt", "tcp", "conntrack"))})
            if any(not k[4].startswith(("chain", "target")) for k in keys):
                outs = tr.outcomes
            exp = {_expect(o, FRONT, p.back_if) for o in outs}
            for o in outs:
                if o.verdict == "ACCEPT" and o.local:
                    local[pr.proto].add(f"{A.fmt_ip(o.dst)}:{o.dport}")
            predictions.append((pr, exp, bool(tr.unknowns())))
        watchers: list[tuple[str, subprocess.Popen[str], int]] = []
        for where, ns, argv in (("client", client, ["sniff", CLIENT_IF]), ("pods", pods, ["sniff", "eth0"]),
                                *(("node", node, ["listen", proto, *sorted(specs)])
                                  for proto, specs in local.items() if specs)):
            child = ns.popen([*WIRE, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if line != "ready":
                err = child.stderr.read() if child.stderr else ""
                res.skipped = f"{where} watcher did not start: {err.strip()[:200]}"
                return res
            # how many markers it will print: one per listening socket, one for a sniffer
            watchers.append((where, child, len(argv) - 2 if argv[0] == "listen" else 1))
        # every packet its own flow: a distinct source port per packet
        batches: dict[str, list[list[str | int]]] = {"client": [], "pod": [], "node": []}
        owner: list[tuple[int, str, int]] = []
        sport = 41000
        for k, (pr, _exp, _u) in enumerate(predictions):
            _ns, src, _in = senders[pr.sender]
            for _ in range(count):
                sport += 1
                owner.append((k, pr.sender, len(batches[pr.sender])))
                batches[pr.sender].append([pr.proto, src, sport, pr.dst, pr.dport])
        answers_by: dict[str, list[str]] = {}
        for who, batch in batches.items():
            if batch:
                ns = senders[who][0]
                answers_by[who] = json.loads(ns.run([*WIRE, "send", json.dumps(batch)], timeout=60).stdout)
        # a marker from the node to each watcher, sent after every probe: once a watcher has
        # printed it, it has printed everything that arrived before (its output is in order)
        markers: list[list[str | int]] = [["udp", p.node_ip, MARK_PORT, client_ip, MARK_PORT],
                                       ["udp", back_ip, MARK_PORT, pod_src, MARK_PORT]]
        for proto, specs in local.items():
            for spec in sorted(specs):
                host, _, port = spec.rpartition(":")
                # its own source port: two sockets cannot both bind node_ip:MARK_PORT
                markers.append([proto, p.node_ip, MARK_PORT + len(markers), host, int(port)])
        node.run([*WIRE, "send", json.dumps(markers)], timeout=60)
        seen: dict[tuple[str, int], tuple[str, str, int, str]] = {}
        for where, child, want in watchers:
            for r in _read_until_markers(child, want):
                # keyed by the probe's source port: masquerade keeps it unless it clashes
                seen.setdefault((r["proto"], r["sport"]), (where, r["dst"], r["dport"], r["src"]))
        observed: dict[int, list[object]] = {}
        flat = [(who, i, b) for who in ("client", "pod", "node") for i, b in enumerate(batches[who])]
        index = {(who, i): b for who, i, b in flat}
        for k, who, idx in owner:
            b = index[(who, idx)]
            hit = seen.get((str(b[0]), int(b[2])))
            if hit is not None:
                obs: object = hit
            else:
                ans = answers_by[who][idx]
                obs = "refused" if ans == "refused" else "timeout"
            observed.setdefault(k, []).append(obs)
        for k, (pr, exp, unk) in enumerate(predictions):
            outcomes = observed.get(k, [])
            ok = all(o in exp for o in outcomes) and (len(exp) != 1 or len(outcomes) == count)
            res.probes.append(ProbeResult(pr, ok, exp, outcomes, unk))
    return res


def _read_until_markers(child: subprocess.Popen[str], want: int, timeout: float = 3.0) -> list[dict[str, Any]]:
    """A watcher's records up to its `want`-th marker (or the timeout, if a rule ate a marker).

    Reads the raw pipe: nothing sits in Python's buffer (the watcher printed only `ready`
    before), so `select` tells the truth about what is left to read."""
    assert child.stdout is not None
    fd = child.stdout.fileno()
    buf = b""
    got = 0
    deadline = time.monotonic() + timeout
    while got < want:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
        got = sum(1 for ln in buf.decode().splitlines() if ln.startswith("{") and json.loads(ln)["sport"] < 1024)
    child.terminate()
    child.wait(timeout=10)
    out = []
    for ln in buf.decode().splitlines():
        if ln.startswith("{"):
            r = json.loads(ln)
            if r["sport"] >= 1024:  # markers come from ports below 1024, probes from above
                out.append(r)
    return out


def table(results: list[DumpResult]) -> str:
    """The corpus table: per dump its era, probes and agreements; then the totals."""
    rows = ["dump | loader | probes | agree | note", "--- | --- | --- | --- | ---"]
    for r in results:
        n = len(r.probes)
        a = sum(pr.agrees for pr in r.probes)
        rows.append(f"{r.entry.name} | {r.loader or loader_of(r.entry)} | {n} | {a} | {r.skipped}")
    dumps = len(results)
    probes = sum(len(r.probes) for r in results)
    agree = sum(pr.agrees for r in results for pr in r.probes)
    skipped = sum(1 for r in results if r.skipped)
    rows.append(f"total: {dumps} dumps ({skipped} not loaded), {probes} probes, {agree} agree")
    kinds: dict[str, list[int]] = {}
    for r in results:
        for pr in r.probes:
            k = kinds.setdefault(pr.probe.kind, [0, 0])
            k[0] += 1
            k[1] += pr.agrees
    rows += [f"  {kind}: {n} probes, {a} agree" for kind, (n, a) in sorted(kinds.items())]
    return "\n".join(rows)

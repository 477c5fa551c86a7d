"""The only code that hands IPVS mode's state to the kernel, and reads it back to diff against.

Four tools, all through one `run` callable (kernel/exec.py):
- IPVS: `ipvsadm-save -n` read, operations fed to `ipvsadm -R` (one process per sync). Not
  `ipvsadm-restore`: that wrapper runs `ipvsadm -C` first, which would drop every virtual server
  and, with expire_nodest_conn, reset every connection (found in the VM test);
- ipsets: `ipset save` read, `ipset restore -exist` fed the creates, adds and dels;
- kube-ipvs0: `ip -o addr show dev kube-ipvs0`, `ip link add`, `ip -batch -` of `addr add/del`;
- iptables: `iptables-restore --noflush` (the ruleset), `iptables -C`/`-I` (upstream's jumps).

Every step diffs against what the kernel holds, so a resync without change sends nothing to
`ipvsadm -R`, ipset or ip, and the iptables text is re-sent only when it differs from the last
one loaded (upstream resends it every time; it is idempotent, we only skip the work).
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from kubeproxy.backends.iptables.apply import RESTORE_TIMEOUT_BASE, check_restore, iptables_tool, restore, restore_timeout
from kubeproxy.backends.ipvs.render import (
    DUMMY_DEVICE,
    JUMPS,
    SETS,
    RealServer,
    VirtualServer,
    create_line,
    set_name,
)
from kubeproxy.kernel.exec import Runner, bounded, local_run
from kubeproxy.model.contract import SyncError
from kubeproxy.model.options import Family

_PROTO_OPT = {"-t": "TCP", "--tcp-service": "TCP", "-u": "UDP", "--udp-service": "UDP", "--sctp-service": "SCTP"}
# ipvsadm prints scheduler flags by their aliases; we keep upstream's generic names.
_FLAG_ALIASES = {"sh-fallback": "flag-1", "mh-fallback": "flag-1", "sh-port": "flag-2", "mh-port": "flag-2"}


class IpvsUnavailable(SyncError):
    """The kernel has no IPVS (or no ipset): start-up stops with what to load."""


@dataclass
class LiveRealServer:
    rs: RealServer
    active: int = 0
    inactive: int = 0


def _split_hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


def parse_ipvsadm_save(text: str) -> dict[VirtualServer, list[RealServer]]:
    """`ipvsadm-save -n` (or our ipvsadm_save_text) back into virtual and real servers."""
    services: dict[VirtualServer, list[RealServer]] = {}
    by_key: dict[tuple[str, str, int], VirtualServer] = {}
    for raw in text.splitlines():
        words = raw.split()
        if not words or words[0] not in ("-A", "-a"):
            continue
        proto = _PROTO_OPT.get(words[1])
        if proto is None:
            continue  # fwmark services are not ours
        addr, port = _split_hostport(words[2])
        opts = dict(zip(words[3::2], words[4::2], strict=False))
        if words[0] == "-A":
            flags = tuple(sorted(_FLAG_ALIASES.get(f, f) for f in opts.get("-b", "").split(",") if f))
            vs = VirtualServer(proto, addr, port, opts.get("-s", "wlc"), int(opts.get("-p", "0")), flags)
            services[vs] = []
            by_key[vs.key] = vs
        else:
            owner = by_key.get((proto, addr, port))
            rs_addr, rs_port = _split_hostport(opts["-r"])
            # ipvsadm-save writes the forwarding method as a bare flag (-m), so pairs shift: find -w.
            weight = int(words[words.index("-w") + 1]) if "-w" in words else 1
            if owner is not None:
                services[owner].append(RealServer(rs_addr, rs_port, weight))
    return services


def parse_connections(text: str) -> dict[tuple[str, str, int, str, int], tuple[int, int]]:
    """(proto, vaddr, vport, raddr, rport) -> (ActiveConn, InActConn) from `ipvsadm -Ln`."""
    out: dict[tuple[str, str, int, str, int], tuple[int, int]] = {}
    current: tuple[str, str, int] | None = None
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("TCP", "UDP", "SCTP"):
            host, port = _split_hostport(words[1])
            current = (words[0], host, port)
        elif len(words) >= 6 and words[0] == "->" and current is not None and words[4].isdigit():
            host, port = _split_hostport(words[1])
            out[(*current, host, port)] = (int(words[4]), int(words[5]))
    return out


@dataclass(frozen=True)
class IpvsOps:
    """What one sync sends to `ipvsadm -R`, and what the graceful-termination pass deletes."""

    lines: tuple[str, ...]
    added_services: int = 0
    deleted_services: int = 0
    added_reals: int = 0
    quiesced_reals: int = 0  # weight set to 0, deleted once their connections are gone
    deleted_reals: int = 0


def graceful_termination_needed(protocol: str) -> bool:
    """Upstream's IsRsGracefulTerminationNeeded: only TCP real servers wait for their connections."""
    return protocol.upper() not in ("UDP", "SCTP")


def diff_ipvs(
    want: Mapping[VirtualServer, Iterable[RealServer]],
    have: Mapping[VirtualServer, Iterable[RealServer]],
    connections: Mapping[tuple[str, str, int, str, int], tuple[int, int]],
    *,
    exclude_cidrs: Iterable[str] = (),
    family: Family = Family.IPV4,
) -> IpvsOps:
    """The operations taking `have` to `want` (upstream's syncService, syncEndpoint, cleanLegacyService).

    A TCP real server that is no longer wanted is not deleted at once: its weight goes to 0 so that
    no new connection picks it, and it is deleted in a later sync once it has no connections left
    (upstream's graceful termination manager). UDP and SCTP real servers are deleted at once, as
    upstream does (IsRsGracefulTerminationNeeded): IPVS counts their flows as InActConn until the
    udp timeout, so waiting would keep a dead pod in the table for minutes; with
    expire_nodest_conn=1 the kernel drops their entries on the next packet. Virtual servers inside --ipvs-exclude-cidrs, or of
    the other IP family, are someone else's and are left alone.
    """
    excluded = [ipaddress.ip_network(c, strict=False) for c in exclude_cidrs]
    have_by_key = {vs.key: (vs, list(rs)) for vs, rs in have.items()}
    lines: list[str] = []
    n_add_vs = n_del_vs = n_add_rs = n_quiesce = n_del_rs = 0
    want_keys = set()
    for vs in sorted(want, key=lambda v: v.key):
        want_keys.add(vs.key)
        reals = {(r.address, r.port): r for r in want[vs]}
        current = have_by_key.get(vs.key)
        arg = vs.service_arg()
        if current is None:
            lines.append(_service_line("-A", vs))
            n_add_vs += 1
            cur_reals: dict[tuple[str, int], RealServer] = {}
        else:
            if current[0] != vs:
                lines.append(_service_line("-E", vs))
            cur_reals = {(r.address, r.port): r for r in current[1]}
        for rkey in sorted(reals.keys() - cur_reals.keys()):
            lines.append(f"-a {arg} -r {_hp(*rkey)} -m -w {reals[rkey].weight}")
            n_add_rs += 1
        for rkey in sorted(reals.keys() & cur_reals.keys()):
            if cur_reals[rkey].weight != reals[rkey].weight:
                # Back from termination (or weight changed by hand): upstream re-adds it at weight 1.
                lines.append(f"-e {arg} -r {_hp(*rkey)} -m -w {reals[rkey].weight}")
        for rkey in sorted(cur_reals.keys() - reals.keys()):
            active, inactive = connections.get((vs.protocol, vs.address, vs.port, *rkey), (0, 0))
            if not graceful_termination_needed(vs.protocol) or active + inactive == 0:
                lines.append(f"-d {arg} -r {_hp(*rkey)}")
                n_del_rs += 1
            elif cur_reals[rkey].weight != 0:
                lines.append(f"-e {arg} -r {_hp(*rkey)} -m -w 0")
                n_quiesce += 1
    for key, (vs, _) in sorted(have_by_key.items()):
        if key in want_keys:
            continue
        ip = ipaddress.ip_address(vs.address)
        if (ip.version == 6) != family.ipv6 or any(ip in net for net in excluded if net.version == ip.version):
            continue
        lines.append(f"-D {vs.service_arg()}")
        n_del_vs += 1
    return IpvsOps(tuple(lines), n_add_vs, n_del_vs, n_add_rs, n_quiesce, n_del_rs)


def _hp(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _service_line(op: str, vs: VirtualServer) -> str:
    line = f"{op} {vs.service_arg()} -s {vs.scheduler}"
    if vs.flags:
        line += f" -b {','.join(vs.flags)}"
    if vs.persistent:
        line += f" -p {vs.persistent}"
    return line


def parse_ipset_save(text: str) -> dict[str, set[str]]:
    """Entries of every set in `ipset save` output (the sets we do not own included)."""
    sets: dict[str, set[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] == "create":
            sets.setdefault(words[1], set())
        elif len(words) >= 3 and words[0] == "add":
            sets.setdefault(words[1], set()).add(words[2])
    return sets


def diff_ipsets(want: Mapping[str, Set[str]], have: Mapping[str, Set[str]], family: Family) -> list[str]:
    """`ipset restore` lines taking `have` to `want`: creates for missing sets, then dels and adds.

    `want` is keyed by the names in SETS, `have` by the kernel's names: `family`'s sets only are
    touched (KUBE-6-... for IPv6, set_name), so the other family's lane keeps its own."""
    out: list[str] = []
    for spec in SETS:
        if set_name(spec.name, family) not in have:
            out.append(create_line(spec, family))
    for spec in SETS:
        name = set_name(spec.name, family)
        cur = have.get(name, set())
        target = want.get(spec.name, frozenset())
        out.extend(f"del {name} {e}" for e in sorted(cur - target))
        out.extend(f"add {name} {e}" for e in sorted(target - cur))
    return out


@dataclass
class Applier:
    """Talks to one node's kernel; remembers the last iptables text it loaded."""

    run: Runner = local_run
    family: Family = Family.IPV4
    variant: str = ""
    last_iptables: str | None = None
    ops: dict[str, int] = field(default_factory=dict)  # tool invocations that changed something

    def _iptables(self, suffix: str = "") -> str:
        return iptables_tool(self.family, self.variant, suffix)

    def _count(self, what: str) -> None:
        self.ops[what] = self.ops.get(what, 0) + 1

    def listing(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """A listing, bounded as a restore's fixed costs are; running out raises ToolTimeout."""
        with bounded(argv[0], None):
            return self.run(argv, check=check, timeout=RESTORE_TIMEOUT_BASE)

    def feed(self, argv: list[str], lines: list[str]) -> subprocess.CompletedProcess[str]:
        """`lines` as the tool's input, bounded as a restore of as many lines; running out
        raises ToolTimeout (the live loop tries again with a longer bound)."""
        text = "\n".join(lines) + "\n"
        with bounded(argv[0], len(lines)):
            return self.run(argv, input=text, check=False, timeout=restore_timeout(text, len(lines)))

    def read_ipvs(self) -> tuple[dict[VirtualServer, list[RealServer]], dict[tuple[str, str, int, str, int], tuple[int, int]]]:
        saved = self.listing(["ipvsadm-save", "-n"]).stdout
        listed = self.listing(["ipvsadm", "-Ln"]).stdout
        return parse_ipvsadm_save(saved), parse_connections(listed)

    def apply_ipvs(self, ops: IpvsOps) -> None:
        if not ops.lines:
            return
        proc = self.feed(["ipvsadm", "-R"], list(ops.lines))
        self._count("ipvsadm -R")
        if proc.returncode != 0:
            raise SyncError(f"ipvsadm -R failed: {proc.stderr.strip()}")

    def apply_ipsets(self, want: Mapping[str, frozenset[str]], family: Family) -> int:
        have = parse_ipset_save(self.listing(["ipset", "save"]).stdout)
        lines = diff_ipsets(want, have, family)
        if lines:
            proc = self.feed(["ipset", "restore", "-exist"], lines)
            self._count("ipset restore")
            if proc.returncode != 0:
                raise SyncError(f"ipset restore failed: {proc.stderr.strip()}")
        return len(lines)

    def ensure_dummy(self, want: Iterable[str]) -> tuple[int, int]:
        """kube-ipvs0 exists and holds exactly `want` (of our family); returns (added, removed)."""
        shown = self.listing(["ip", "-o", "addr", "show", "dev", DUMMY_DEVICE], check=False)
        if shown.returncode != 0:
            self.listing(["ip", "link", "add", DUMMY_DEVICE, "type", "dummy"])
            self._count("ip link add")
            shown = self.listing(["ip", "-o", "addr", "show", "dev", DUMMY_DEVICE])
        have: set[str] = set()
        fam = "inet6" if self.family.ipv6 else "inet"
        for line in shown.stdout.splitlines():
            words = line.split()
            if fam in words:
                have.add(words[words.index(fam) + 1].split("/")[0])
        want_set = set(want)
        plen = "128" if self.family.ipv6 else "32"
        # One `ip -batch` for all changes: 10k services are 10k addresses on the first sync.
        lines = [f"addr add {ip}/{plen} dev {DUMMY_DEVICE}" for ip in sorted(want_set - have)]
        lines += [f"addr del {ip}/{plen} dev {DUMMY_DEVICE}" for ip in sorted(have - want_set)]
        if lines:
            proc = self.feed(["ip", "-batch", "-"], lines)
            self._count("ip -batch")
            if proc.returncode != 0:
                raise SyncError(f"ip -batch (addresses of {DUMMY_DEVICE}) failed: {proc.stderr.strip()}")
        return len(want_set - have), len(have - want_set)

    def apply_iptables(self, text: str) -> bool:
        """Load the ruleset unless it is the one loaded last; then ensure upstream's jumps."""
        if text == self.last_iptables:
            return False
        self._count("iptables-restore")
        restore(text, self.run, family=self.family, variant=self.variant)
        for jump in JUMPS:
            spec = ["-m", "comment", "--comment", jump.comment, "-j", jump.target]
            probe = self.listing([self._iptables(), "-w", "-t", jump.table, "-C", jump.builtin, *spec], check=False)
            if probe.returncode != 0:
                self.listing([self._iptables(), "-w", "-t", jump.table, "-I", jump.builtin, *spec])
                self._count("iptables -I")
        self.last_iptables = text
        return True

    def check_iptables(self, text: str) -> str | None:
        return check_restore(text, self.run, family=self.family, variant=self.variant)


def check_kernel(run: Runner = local_run, scheduler: str = "rr") -> None:
    """Load IPVS's modules and read /proc/net/ip_vs; IpvsUnavailable says what is missing."""
    modules = ["ip_vs", f"ip_vs_{scheduler}", "nf_conntrack", "ip_set", "xt_set", "dummy"]
    failed: list[str] = []
    for mod in modules:
        try:
            proc = run(["modprobe", mod], check=False)
        except OSError:
            failed.append(mod)
            continue
        if proc.returncode != 0:
            failed.append(mod)
    probe = run(["cat", "/proc/net/ip_vs"], check=False)
    if probe.returncode != 0:
        raise IpvsUnavailable(
            "ipvs proxy mode needs IPVS in the kernel: /proc/net/ip_vs is missing"
            + (f" and `modprobe {' '.join(failed)}` failed" if failed else "")
            + f"; load the modules {', '.join(modules)} (CONFIG_IP_VS, CONFIG_IP_VS_{scheduler.upper()}, "
            "CONFIG_IP_SET, CONFIG_NETFILTER_XT_SET) or use --proxy-mode iptables or nftables"
        )

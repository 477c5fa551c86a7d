"""An in-memory IPVS, ipset and kube-ipvs0 for tests without root (the host kernel has no IPVS).

`FakeIpvs().run` is a `Runner` for what the IPVS backend runs besides iptables: `ipvsadm-save -n`,
`ipvsadm -Ln`, `ipvsadm -R`, `ipvsadm-restore` (which, like the real wrapper, runs `ipvsadm -C`
first), `ipvsadm -C` / `--set`, `ipset save` / `restore -exist` /
`destroy`, `ip -o addr show [dev kube-ipvs0]`, `ip link add|del kube-ipvs0`, `ip addr add|del` (alone or in `ip -batch -`),
`modprobe`, `sysctl -w`, `cat /proc/net/ip_vs`. It refuses what the kernel refuses where the backend
could get it wrong: a real server for a missing virtual server, a duplicate virtual server, a set
entry that does not fit the set's type, an entry for a missing set. tests/vm checks the backend
against the real thing.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

from kubeproxy.backends.ipvs.apply import _PROTO_OPT, _split_hostport
from kubeproxy.backends.ipvs.render import DUMMY_DEVICE, RealServer, VirtualServer, ipvsadm_save_text
from kubeproxy.kernel.fake_tool import Refused, answer


def _inet(addr: str) -> str:
    """`ip -o addr`'s family word and address, as the kernel lists it (kube-ipvs0 holds both families)."""
    return f"inet6 {addr}/128" if ":" in addr else f"inet {addr}/32"


def _valid_entry(set_type: str, entry: str, family: str = "inet") -> bool:
    """Whether `entry` parses as the set type's element (ip / port / proto:port / net parts),
    its addresses of the set's family (`family inet6` sets take IPv6 only, as the kernel's)."""
    parts = entry.split(",")
    kinds = set_type.split(":", 1)[1].split(",")
    if len(parts) != len(kinds):
        return False
    version = 6 if family == "inet6" else 4
    try:
        for kind, part in zip(kinds, parts, strict=True):
            if kind == "ip":
                if ipaddress.ip_address(part).version != version:
                    return False
            elif kind == "net":
                if ipaddress.ip_network(part, strict=False).version != version:
                    return False
            elif kind == "port":
                port = part.rsplit(":", 1)[-1]
                if not port.isdigit() or not 0 <= int(port) <= 65535:
                    return False
                if ":" in part and part.split(":")[0] not in ("tcp", "udp", "sctp"):
                    return False
    except ValueError:
        return False
    return True


@dataclass
class FakeIpvs:
    services: dict[tuple[str, str, int], tuple[VirtualServer, dict[tuple[str, int], RealServer]]] = field(default_factory=dict)
    # (proto, vaddr, vport, raddr, rport) -> (active, inactive): tests set these to hold a real server busy.
    connections: dict[tuple[str, str, int, str, int], tuple[int, int]] = field(default_factory=dict)
    sets: dict[str, tuple[str, set[str]]] = field(default_factory=dict)  # name -> (type, entries)
    families: dict[str, str] = field(default_factory=dict)  # name -> "inet" / "inet6" (hash sets)
    dummy: set[str] | None = None  # kube-ipvs0's addresses; None: no such link
    local_addresses: list[tuple[str, str]] = field(default_factory=lambda: [("lo", "127.0.0.1"), ("eth0", "192.168.0.2")])
    has_ipvs: bool = True
    sysctls: dict[str, str] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def handles(self, argv: Sequence[str]) -> bool:
        tool = argv[0]
        if tool in ("ipvsadm", "ipvsadm-save", "ipvsadm-restore", "ipset", "modprobe", "sysctl", "cat"):
            return True
        if tool == "ip":
            # kube-ipvs0 and the address listing are ours; local routes stay with FakeConntrack.
            return DUMMY_DEVICE in argv or list(argv[:4]) == ["ip", "-o", "addr", "show"] or list(argv[:2]) == ["ip", "-batch"]
        return False

    def run(
        self, argv: Sequence[str], *, input: str | None = None, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return answer(self.calls, argv, lambda args: self._dispatch(args, input or ""), check=check)

    def table(self) -> dict[VirtualServer, tuple[RealServer, ...]]:
        return {vs: tuple(sorted(reals.values())) for vs, reals in self.services.values()}

    def _dispatch(self, args: list[str], stdin: str) -> str:
        tool = args[0]
        if tool == "modprobe":
            if not self.has_ipvs and args[1].startswith("ip_vs"):
                raise Refused(f"modprobe: FATAL: Module {args[1]} not found")
            return ""
        if tool == "cat":
            if not self.has_ipvs:
                raise Refused(f"cat: {args[1]}: No such file or directory")
            return "IP Virtual Server version 1.2.1 (size=4096)\n"
        if tool == "sysctl":
            key, _, value = args[-1].partition("=")
            self.sysctls[key] = value
            return ""
        if tool == "ipvsadm-save":
            return ipvsadm_save_text(self.table())
        if tool == "ipvsadm-restore":
            self.services.clear()  # the real script is `ipvsadm -C; ipvsadm -R`
            self._restore_ipvs(stdin)
            return ""
        if args[1:] == ["-R"]:
            self._restore_ipvs(stdin)
            return ""
        if tool == "ipvsadm":
            return self._ipvsadm(args[1:])
        if tool == "ipset":
            return self._ipset(args[1:], stdin)
        if args[1:] == ["-batch", "-"]:
            for line in stdin.splitlines():
                if line.strip():
                    self._ip(line.split())
            return ""
        return self._ip(args[1:])

    def _ipvsadm(self, args: list[str]) -> str:
        if args == ["-C"]:
            self.services.clear()
            return ""
        if args and args[0] == "--set":
            return ""
        if args == ["-Ln"]:
            out = ["IP Virtual Server version 1.2.1 (size=4096)", "Prot LocalAddress:Port Scheduler Flags",
                   "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn"]
            for vs, reals in self.table().items():
                out.append(f"{vs.protocol}  {vs.address}:{vs.port} {vs.scheduler}")
                for rs in reals:
                    a, i = self.connections.get((vs.protocol, vs.address, vs.port, rs.address, rs.port), (0, 0))
                    out.append(f"  -> {rs.address}:{rs.port}  Masq    {rs.weight}      {a}          {i}")
            return "\n".join(out) + "\n"
        raise Refused(f"ipvsadm: unsupported in the fake: {args}")

    def _restore_ipvs(self, text: str) -> None:
        # ipvsadm -R stops at the first failing line, having applied those before it.
        for n, line in enumerate(text.splitlines(), 1):
            words = line.split()
            if not words:
                continue
            op, proto = words[0], _PROTO_OPT.get(words[1])
            if proto is None:
                raise Refused(f"line {n}: unknown service option {words[1]}")
            addr, port = _split_hostport(words[2])
            key = (proto, addr, port)
            opts = dict(zip(words[3::2], words[4::2], strict=False))
            if op in ("-A", "-E"):
                flags = tuple(opts["-b"].split(",")) if "-b" in opts else ()
                vs = VirtualServer(proto, addr, port, opts.get("-s", "wlc"), int(opts.get("-p", "0")), flags)
                if op == "-A" and key in self.services:
                    raise Refused(f"line {n}: Service already exists")
                if op == "-E" and key not in self.services:
                    raise Refused(f"line {n}: No such service")
                self.services[key] = (vs, self.services[key][1] if op == "-E" else {})
            elif op == "-D":
                if self.services.pop(key, None) is None:
                    raise Refused(f"line {n}: No such service")
            elif op in ("-a", "-e", "-d"):
                if key not in self.services:
                    raise Refused(f"line {n}: Service not defined")
                reals = self.services[key][1]
                raddr, rport = _split_hostport(words[words.index("-r") + 1])
                weight = int(words[words.index("-w") + 1]) if "-w" in words else 1
                rkey = (raddr, rport)
                if op == "-a" and rkey in reals:
                    raise Refused(f"line {n}: Destination already exists")
                if op in ("-e", "-d") and rkey not in reals:
                    raise Refused(f"line {n}: No such destination")
                if op == "-d":
                    del reals[rkey]
                else:
                    reals[rkey] = RealServer(raddr, rport, weight)
            else:
                raise Refused(f"line {n}: unknown command {op}")

    def _ipset(self, args: list[str], stdin: str) -> str:
        if args == ["save"]:
            out: list[str] = []
            for name, (typ, entries) in self.sets.items():
                out.append(f"create {name} {typ}")
                out.extend(f"add {name} {e}" for e in sorted(entries))
            return "\n".join(out) + ("\n" if out else "")
        if args[:1] == ["destroy"]:
            self.families.pop(args[1], None)
            if self.sets.pop(args[1], None) is None:
                raise Refused(f"ipset v7.17: The set with the given name does not exist: {args[1]}")
            return ""
        if args[:1] == ["restore"]:
            exist = "-exist" in args
            work = {k: (t, set(e)) for k, (t, e) in self.sets.items()}
            families = dict(self.families)
            for n, line in enumerate(stdin.splitlines(), 1):
                words = line.split()
                if not words:
                    continue
                if words[0] == "create":
                    if words[1] in work and not exist:
                        raise Refused(f"ipset v7.17: Error in line {n}: Set cannot be created: "
                                       "set with the same name already exists")
                    work.setdefault(words[1], (words[2], set()))
                    fam = words[words.index("family") + 1] if "family" in words else "inet"
                    families.setdefault(words[1], fam)
                elif words[0] in ("add", "del"):
                    if words[1] not in work:
                        raise Refused(f"ipset v7.17: Error in line {n}: The set with the given name does not exist")
                    typ, entries = work[words[1]]
                    if not _valid_entry(typ, words[2], families.get(words[1], "inet")):
                        raise Refused(f"ipset v7.17: Error in line {n}: Syntax error: '{words[2]}' is invalid for {typ}")
                    if words[0] == "add":
                        entries.add(words[2])
                    else:
                        entries.discard(words[2])
                else:
                    raise Refused(f"ipset v7.17: Error in line {n}: unknown command {words[0]}")
            self.sets = work  # restore is all or nothing in this fake; the kernel's stops at the error
            self.families = {k: v for k, v in families.items() if k in work}
            return ""
        raise Refused(f"ipset: unsupported in the fake: {args}")

    def _ip(self, args: list[str]) -> str:
        if args[:3] == ["-o", "addr", "show"]:
            if args[3:] == ["dev", DUMMY_DEVICE]:
                if self.dummy is None:
                    raise Refused(f'Device "{DUMMY_DEVICE}" does not exist.')
                return "".join(f"9: {DUMMY_DEVICE}    {_inet(a)} scope global {DUMMY_DEVICE}\n" for a in sorted(self.dummy))
            listed = [*self.local_addresses, *((DUMMY_DEVICE, a) for a in sorted(self.dummy or ()))]
            return "".join(f"{i}: {dev}    {_inet(a)} scope global {dev}\n" for i, (dev, a) in enumerate(listed, 1))
        if args[:2] == ["link", "add"]:
            if self.dummy is not None:
                raise Refused("RTNETLINK answers: File exists")
            self.dummy = set()
            return ""
        if args[:2] == ["link", "del"]:
            if self.dummy is None:
                raise Refused("Cannot find device")
            self.dummy = None
            return ""
        if args[:1] == ["addr"] and args[1] in ("add", "del"):
            if self.dummy is None:
                raise Refused("Cannot find device")
            addr = args[2].split("/")[0]
            if args[1] == "add":
                if addr in self.dummy:
                    raise Refused("RTNETLINK answers: File exists")
                self.dummy.add(addr)
            else:
                if addr not in self.dummy:
                    raise Refused("RTNETLINK answers: Cannot assign requested address")
                self.dummy.discard(addr)
            return ""
        raise Refused(f"ip: unsupported in the fake: {args}")

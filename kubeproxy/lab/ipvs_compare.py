"""Two IPVS nodes' kernel state made comparable: the IPVS table (`ipvsadm-save -n`), the ipsets
(`ipset save`), kube-ipvs0's addresses and the iptables rules, each node's own addresses named by
role.

An IPVS node writes its own addresses where an iptables node writes none: a NodePort's virtual
server on every local address, SCTP NodePort set entries with the node IP, a Local Service's real
servers and hairpin (KUBE-LOOP-BACK) entries for the node's own pods only. Two nodes that host
mirror-image pods (lab/side_by_side.py) give equal texts once, on each node, its own addresses are
named `<node>` and its peer's `<peer>`: node IPs as `node-ip(<node>)`, pod addresses by the pod's
name with the node's name replaced (`pod(lweb-0-<node>)`, `pod6(...)` for IPv6). Addresses of
other nodes' pods are the same on both and stay as they are.

What the kernel keeps in an order of its own is compared as sets: virtual servers (listed in
hash order, which depends on the addresses), a virtual server's real servers, set members and
kube-ipvs0's addresses. A set's `initval` (a hash seed the kernel picks at random) is left out.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kubeproxy.backends.ipvs.apply import parse_ipvsadm_save
from kubeproxy.lab import rules_compare

_INITVAL = re.compile(r" initval 0x[0-9a-f]+")
# What a node's dump holds (lab/side_by_side.py's dump in ipvs mode), besides iptables-save by family.
IPVS, IPSET, DUMMY = "ipvs", "ipset", "kube-ipvs0"


@dataclass(frozen=True)
class Roles:
    """Which addresses are this node's and its peer's, and how each is named."""

    names: Mapping[str, str]  # address -> role name

    @classmethod
    def of(
        cls,
        node_name: str,
        node_ips: Iterable[str],
        peer_name: str,
        peer_ips: Iterable[str],
        pods_by_ip: Mapping[str, str],
    ) -> Roles:
        names: dict[str, str] = {}
        for who, ips in (("<node>", node_ips), ("<peer>", peer_ips)):
            for ip in ips:
                names[_canonical(ip)] = f"node-ip{_suffix(ip)}({who})"
        for ip, pod in pods_by_ip.items():
            for node, who in ((node_name, "<node>"), (peer_name, "<peer>")):
                if node in pod:
                    names[_canonical(ip)] = f"pod{_suffix(ip)}({pod.replace(node, who)})"
        return cls(names)

    def rename(self, text: str) -> str:
        if not self.names:
            return text
        # An IPv4 address may be followed by its port (`10.0.0.1:80`), an IPv6 one is not (`[fd00::1]:80`).
        for version, after in ((4, r"(?![\w.])"), (6, r"(?![\w:.])")):
            keys = sorted((k for k in self.names if ipaddress.ip_address(k).version == version), key=len, reverse=True)
            if keys:
                pattern = re.compile(r"(?<![\w:.])(" + "|".join(map(re.escape, keys)) + ")" + after)
                text = pattern.sub(lambda m: self.names[m.group(1)], text)
        return text


def _canonical(ip: str) -> str:
    return str(ipaddress.ip_address(ip))


def _suffix(ip: str) -> str:
    return "6" if ipaddress.ip_address(ip).version == 6 else ""


def serving_addresses(save: str) -> set[str]:
    """The real servers' addresses that take new connections (weight > 0) in `ipvsadm-save -n`."""
    return {rs.address for reals in parse_ipvsadm_save(save).values() for rs in reals if rs.weight > 0}


def ipvs_table(save: str) -> dict[str, frozenset[str]]:
    """`ipvsadm-save -n` as virtual server line -> its real servers (without the service part)."""
    table: dict[str, set[str]] = {}
    line_of: dict[tuple[str, str], str] = {}  # (protocol flag, address:port) -> its -A line
    for raw in save.splitlines():
        words = raw.split()
        if len(words) < 3:
            continue
        if words[0] == "-A":
            line_of[(words[1], words[2])] = " ".join(words)
            table.setdefault(" ".join(words), set())
        elif words[0] == "-a":
            # -a -t VIP:PORT -r RIP:PORT ...: the real server's own part follows its virtual server's.
            owner = line_of.get((words[1], words[2]), f"-A {words[1]} {words[2]} (not listed)")
            table.setdefault(owner, set()).add(" ".join(words[3:]))
    return {vs: frozenset(reals) for vs, reals in table.items()}


def ipsets(save: str) -> dict[str, tuple[str, frozenset[str]]]:
    """`ipset save` as set name -> (its create line without initval, its members)."""
    found: dict[str, tuple[str, set[str]]] = {}
    for raw in save.splitlines():
        words = raw.strip().split(" ", 2)
        if len(words) < 2:
            continue
        if words[0] == "create":
            found[words[1]] = (_INITVAL.sub("", raw.strip()), found.get(words[1], ("", set()))[1])
        elif words[0] == "add":
            found.setdefault(words[1], ("", set()))[1].add(words[2] if len(words) > 2 else "")
    return {name: (create, frozenset(members)) for name, (create, members) in found.items()}


def dummy_addresses(text: str) -> frozenset[str]:
    """`ip -o addr show dev kube-ipvs0` as its set of addresses (address/prefix)."""
    out: set[str] = set()
    for line in text.splitlines():
        words = line.split()
        for family in ("inet", "inet6"):
            if family in words:
                out.add(words[words.index(family) + 1])
    return frozenset(out)


def _sets_differ(what: str, left: Mapping[str, object], right: Mapping[str, object], names: Sequence[str]) -> list[str]:
    out: list[str] = []
    for key in sorted(set(left) | set(right)):
        if key not in right:
            out.append(f"{what} {key}: only in {names[0]}: {_show(left[key])}")
        elif key not in left:
            out.append(f"{what} {key}: only in {names[1]}: {_show(right[key])}")
        elif left[key] != right[key]:
            out.append(f"{what} {key}:\n  {names[0]}: {_show(left[key])}\n  {names[1]}: {_show(right[key])}")
    return out


def _show(value: object) -> str:
    if isinstance(value, frozenset):
        return "{" + ", ".join(sorted(value)) + "}"
    if isinstance(value, tuple):
        return " ".join(_show(v) for v in value)
    return str(value)


def differences(
    left: Mapping[str, str],
    left_roles: Roles,
    right: Mapping[str, str],
    right_roles: Roles,
    names: Sequence[str],
    *,
    families: Sequence[str] = ("IPv4", "IPv6"),
    drop: Sequence[str] = (),
) -> list[str]:
    """Every virtual server, set, kube-ipvs0 address and iptables chain that differs between two
    nodes' dumps (keys IPVS, IPSET, DUMMY and the families) once each is role-named; [] when
    equal. `names` labels left and right."""
    a, b = (_named(left, left_roles), _named(right, right_roles))
    out = _sets_differ("ipvs", ipvs_table(a[IPVS]), ipvs_table(b[IPVS]), names)
    out += _sets_differ("ipset", ipsets(a[IPSET]), ipsets(b[IPSET]), names)
    out += _sets_differ("kube-ipvs0", {"addresses": dummy_addresses(a[DUMMY])}, {"addresses": dummy_addresses(b[DUMMY])}, names)
    for family in families:
        found = rules_compare.differences(
            rules_compare.role_named(a[family], "", {}, drop), rules_compare.role_named(b[family], "", {}, drop), *names
        )
        out += [f"{family} {d}" for d in found]
    return out


def _named(dump: Mapping[str, str], roles: Roles) -> dict[str, str]:
    return {key: roles.rename(text) for key, text in dump.items()}

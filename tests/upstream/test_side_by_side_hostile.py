"""Hostile but valid objects given to upstream's kube-proxy and ours side by side (iptables mode):
objects the real API server accepts (kubectl decides, not the test) but that are odd in size,
range or shape. After each, both nodes still serve the ordinary Services, and their whole
`iptables-save` and `ip6tables-save` are equal (kubeproxy/lab/side_by_side.py)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import pytest

from kubeproxy.lab.control_plane import ControlPlaneError
from kubeproxy.lab.side_by_side import OURS_NODE, POD_HOST_NODE, UPSTREAM_NODE, SideBySide
from tests.upstream.hostile_objects import FAMILIES, GHOST, JSON, WEB, hostiles, port, service

pytestmark = pytest.mark.root


@dataclass
class Run:
    bed: SideBySide
    pods: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (IPv4, IPv6)
    selecting: dict[str, tuple[str, ...]] = field(default_factory=lambda: {"web": ("IPv4",), "web-dual": FAMILIES})

    def add_pod(self, name: str, node: str) -> None:
        ips = self.bed.add_pod(name, node, WEB, wired=False).info.ips
        self.pods[name] = (ips[0], ips[1])

    def check(self, step: str, changed: Collection[str]) -> None:
        expected = {
            svc: {(ips[FAMILIES.index(f)], True, True, False) for ips in self.pods.values() for f in families}
            for svc, families in self.selecting.items()
        }
        diffs = self.bed.await_step(expected, families=FAMILIES, changed=changed)
        assert not diffs, f"after {step}:\n" + "\n".join(diffs)


def _applied(bed: SideBySide, objs: list[JSON]) -> str:
    """'' when the API server took every object, else its refusal."""
    try:
        bed.apply(*objs)
    except ControlPlaneError as refused:
        return str(refused)
    return ""


def test_hostile_but_valid_objects_leave_both_nodes_equal(side_by_side: SideBySide) -> None:
    refusals: dict[str, str] = {}
    bed = side_by_side
    run = Run(bed)
    run.add_pod("web-0-remote", POD_HOST_NODE)
    for node in (UPSTREAM_NODE, OURS_NODE):
        run.add_pod(f"web-1-{node}", node)
    bed.apply(
        service("web", [port("http", 80)], type="NodePort"),
        service("web-dual", [port("http", 80)], ipFamilyPolicy="RequireDualStack", ipFamilies=["IPv6", "IPv4"]),
    )
    bed.start_proxies()
    run.check("the first sync", FAMILIES)
    for hostile in hostiles():
        refusal = _applied(bed, hostile.objects)
        if refusal:
            refusals[hostile.what] = refusal
            continue
        run.selecting.update(hostile.selecting)
        run.check(hostile.what, hostile.touched)
    # A change of both families after the last: whatever a step above left unsynced shows here.
    for node in (UPSTREAM_NODE, OURS_NODE):
        run.add_pod(f"web-2-{node}", node)
    run.check("web pods added after every hostile object", FAMILIES)
    # The odd objects reached the rules (equal rules that both left them out would prove little).
    upstream = bed.dump(UPSTREAM_NODE)
    for text in SEEN_IPV4:
        assert text in upstream["IPv4"], text
    assert "2001:db8:e::20/128" in upstream["IPv6"] and "-s 2001:db8:5::/64" in upstream["IPv6"]
    assert "-s 10.0.0.0/8" not in upstream["IPv4"]  # 0.0.0.0/0 beside it: no IPv4 firewall at all
    assert "default/not-ours" not in upstream["IPv4"]
    assert refusals == {}, refusals


SEEN_IPV4 = (
    f"default/{'l' + 'o' * 61 + 'g'}:{'p' * 15}", "default/hundred:p99", "198.51.100.64/32", "--dport 65535",
    "default/three-protos:s", f"{GHOST.format(2)}:80", f"{GHOST.format(3)}:80", f"{GHOST.format(9)}:80",
    f"{GHOST.format(10)}:81", "--seconds 86400", "100.64.39.0/24",
)  # fmt: skip

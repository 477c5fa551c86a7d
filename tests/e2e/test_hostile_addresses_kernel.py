"""Hostile addresses against a live dual-stack node: nothing of them reaches the kernel.

`kubeproxy run --manifests` in the node namespace of tests/e2e/test_dualstack.py's bed (a client,
two pods, IPv4 and IPv6), in iptables mode (iptables-restore and ip6tables-restore) and in
nftables mode, serving ordinary Services to real TCP and UDP traffic. Then objects that only a
manifest can carry arrive, each refused by the API server's validation:

- the rule injection through a zone suffix (`fd00::99%1` followed by newlines and restore
  commands), as an externalIP, as an endpoint address and as an address of the node's own Node;
- endpoint addresses and externalIPs that are unspecified, loopback, link-local or link-local
  multicast.

Each must be one warning naming its object and field; the rules in the kernel afterwards must be
exactly the rules of the world without them (iptables-save, ip6tables-save, nft list ruleset);
the other Services answer before and after; /healthz is 200 and every family's sync succeeds.

To know when the proxy has dealt with the hostile files without waiting a fixed time, a canary
Service is loaded first and removed in the same change that brings the hostile objects: once its
address is gone from the kernel, the sync that saw the hostile objects is done.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from kubeproxy.lab import netns as L
from kubeproxy.lab.apiserver import ApiServer
from kubeproxy.lab.cluster import http_get, kubeproxy_binary, last_lines, poll
from kubeproxy.model.options import Family
from kubeproxy.proxy.live_loop import LiveProxy
from kubeproxy.sources.api import ApiSource
from kubeproxy.sources.connection import connect, load_config
from tests.e2e import test_dualstack
from tests.e2e.test_dualstack import ADDR, CFG, NODE, Bed
from tests.live.test_live import _get, _port
from tests.proxy.test_dualstack import endpoints, node, service

pytestmark = pytest.mark.root
bed = test_dualstack.bed  # the same fixture: the dual-stack bed, removed after each test

INJECTION = "fd00::99%1\n-I KUBE-SERVICES 1 -j RETURN\nCOMMIT\n*filter\n-I INPUT 1 -p tcp --dport 22 -j DROP\nCOMMIT\n*nat\n#"
REFUSED_ENDPOINTS = {"IPv4": ("127.0.0.1", "0.0.0.0", "169.254.169.254", "224.0.0.5"), "IPv6": ("fe80::1", "::1")}
REFUSED_EXTERNAL_IPS = ("127.0.0.1", "0.0.0.0", "169.254.169.254", "224.0.0.1")
HEALTHZ = "127.0.0.1:10256"
METRICS = "127.0.0.1:10249"
CANARY_IPS = ("10.96.0.30", "fd00:96::30")
FAMILIES = (Family.IPV4, Family.IPV6)
MODES = ("iptables", "nftables")


def _svc_ip(family: Family, last: int) -> str:
    return f"{ADDR[family]['svc']}{last:x}" if family.ipv6 else f"{ADDR[family]['svc']}{last}"


def world() -> list[dict[str, Any]]:
    """tests/e2e/test_dualstack.py's Services (web with external and LB IPs, dns over UDP, ...)."""
    return test_dualstack.objects(FAMILIES)


def canary() -> list[dict[str, Any]]:
    return [service("canary", list(CANARY_IPS), port=86),
            *(endpoints("canary", fam, str(ADDR[Family(fam)]["b"])) for fam in ("IPv4", "IPv6"))]  # fmt: skip


def hostile() -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
    """The hostile objects, and for each the (kind, default/name, field) its warning must name."""
    objs: list[dict[str, Any]] = []
    expected: list[tuple[str, str, str]] = []
    injected = service("injected", ["10.96.0.40", "fd00:96::40"], port=80, externalIPs=[INJECTION])
    objs.append(injected)
    expected.append(("Service", "default/injected", "spec.externalIPs[0]"))
    slice_ = endpoints("web", "IPv6", INJECTION)
    slice_["metadata"]["name"] = "web-injected"
    objs.append(slice_)
    expected.append(("EndpointSlice", "default/web-injected", "endpoints[0].addresses[0]"))
    for i, ip in enumerate(REFUSED_EXTERNAL_IPS):
        name = f"external-{i}"
        objs.append(service(name, [f"10.96.0.{41 + i}"], port=80, externalIPs=["203.0.113.8", ip]))
        expected.append(("Service", f"default/{name}", "spec.externalIPs[1]"))
    for family, ips in REFUSED_ENDPOINTS.items():
        for i, ip in enumerate(ips):
            # a second address first: the refusal is of the object, not of one address in it
            good = str(ADDR[Family(family)]["b"])
            slice_ = endpoints("web", family, good)
            slice_["endpoints"][0]["addresses"].append(ip)
            slice_["metadata"]["name"] = name = f"web-{family.lower()}-refused-{i}"
            objs.append(slice_)
            expected.append(("EndpointSlice", f"default/{name}", "endpoints[0].addresses[1]"))
    return objs, expected


def injected_node() -> dict[str, Any]:
    obj = node(*(str(ADDR[f]["node"]) for f in FAMILIES))
    obj["status"]["addresses"].append({"type": "InternalIP", "address": INJECTION})
    return obj


class Node(Protocol):
    """Where the objects come from and how the proxy under test is looked at, whatever its source."""

    def put(self, group: str, objs: list[dict[str, Any]]) -> None:
        """Make `objs` the objects of `group`, in one step."""

    def drop(self, group: str) -> None:
        """Remove the objects of `group`."""

    def check_alive(self) -> None:
        """Raise, with the proxy's last words, if it has ended."""

    def log(self) -> str: ...

    def get(self, what: str) -> tuple[int, str]:
        """GET /healthz or /metrics from the proxy."""


@dataclass
class FileNode:
    """`kubeproxy run --manifests FOLDER` in the node namespace; one manifest file per group."""

    bed: Bed
    folder: Path
    log_path: Path
    proc: subprocess.Popen[str] | None = None

    def put(self, group: str, objs: list[dict[str, Any]]) -> None:
        tmp = self.folder / f".{group}.yaml.tmp"  # written whole, then renamed: never seen half written
        tmp.write_text(yaml.safe_dump_all(objs, sort_keys=False))
        os.replace(tmp, self.folder / f"{group}.yaml")

    def drop(self, group: str) -> None:
        (self.folder / f"{group}.yaml").unlink()

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"the proxy ended:\n{last_lines(self.log())}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def get(self, what: str) -> tuple[int, str]:
        answer = http_get(self.bed.node, f"http://{HEALTHZ if what == 'healthz' else METRICS}/{what}", 5)
        return answer.status, answer.body


@contextmanager
def file_node(bed: Bed, mode: str, tmp_path: Path, world: list[dict[str, Any]]) -> Iterator[FileNode]:
    folder = tmp_path / "manifests"
    folder.mkdir()
    node = FileNode(bed, folder, tmp_path / "proxy.log")
    node.put("cluster", world)
    argv = [kubeproxy_binary(), "-v", "2", "run", "--manifests", str(folder), "--proxy-mode", mode,
            "--hostname-override", NODE, "--cluster-cidr", ",".join(CFG.cluster_cidr),
            "--healthz-bind-address", HEALTHZ, "--metrics-bind-address", METRICS]  # fmt: skip
    with node.log_path.open("w") as out:
        node.proc = bed.node.popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield node
        finally:
            L.stop_process(node.proc, 10)


@dataclass
class ApiNode:
    """The test API server (which stores Services, EndpointSlices and Nodes as given) and a live
    proxy in this process watching it, every kernel command sent into the node namespace."""

    server: ApiServer
    proxy: LiveProxy
    logs: pytest.LogCaptureFixture
    task: asyncio.Task[None]
    groups: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)

    def put(self, group: str, objs: list[dict[str, Any]]) -> None:
        keys = [(o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]) for o in objs]
        for obj in objs:
            self.server.apply(obj)
        for key in self.groups.get(group, []):
            if key not in keys:
                self.server.delete(*key)
        self.groups[group] = keys

    def drop(self, group: str) -> None:
        for key in self.groups.pop(group):
            self.server.delete(*key)

    def check_alive(self) -> None:
        if self.task.done():
            raise AssertionError(f"the proxy ended: {self.task!r}")

    def log(self) -> str:
        return "\n".join(r.getMessage() for r in self.logs.records)

    def get(self, what: str) -> tuple[int, str]:
        return _get(f"http://127.0.0.1:{_port(self.proxy, what)}/{what}")


def rules(bed: Bed, mode: str) -> dict[str, str]:
    """The node's whole ruleset per tool, without counters (traffic moves them)."""
    if mode == "nftables":
        text = bed.node.run(["nft", "list", "ruleset"]).stdout
        return {"nft": re.sub(r"counter packets \d+ bytes \d+", "counter", text)}
    out = {}
    for tool in ("iptables-save", "ip6tables-save"):
        text = bed.node.run([tool]).stdout
        out[tool] = "\n".join(re.sub(r"\[\d+:\d+\]", "[]", line) for line in text.splitlines() if not line.startswith("#"))
    return out


def _address_pattern(ip: str) -> re.Pattern[str]:
    # the address as a whole token: "::1" inside "fd00:96::10" or 0.0.0.0 inside 10.0.0.0 is not it
    return re.compile(rf"(?<![0-9A-Fa-f:.]){re.escape(ip)}(?![0-9A-Fa-f:.])")


def foreign_text(text: str) -> list[str]:
    """Anything of the hostile objects found in `text`."""
    # The proxy's own rules that name the IPv6 loopback: NodePorts exclude it; IPVS mode returns
    # the node's loopback traffic early.
    for own in ("! -d ::1/128", "daddr != ::1 ", "-A KUBE-SERVICES -s ::1/128 -j RETURN"):
        text = text.replace(own, "")
    found = [f"address {ip}" for ip in {*REFUSED_EXTERNAL_IPS, *(ip for ips in REFUSED_ENDPOINTS.values() for ip in ips)}
             if _address_pattern(ip).search(text)]  # fmt: skip
    found += [f"text {t!r}" for t in ("fd00::99", "%1", "--dport 22", "dport 22", "10.96.0.4", "fd00:96::40") if t in text]
    return found


def metrics(node: Node) -> dict[str, float]:
    """The proxy's metrics, `name{labels}` to value."""
    status, body = node.get("metrics")
    assert status == 200
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def family_metric(values: dict[str, float], name: str, family: Family) -> float:
    return next((v for k, v in values.items() if k.startswith(name + "{") and f'ip_family="{family}"' in k), 0.0)


def answers(bed: Bed) -> dict[str, object]:
    """Each ordinary flow, per family: True, or what was seen instead."""
    out: dict[str, object] = {}
    for family in FAMILIES:
        a = ADDR[family]
        flows = {
            "ClusterIP TCP": bed.send(bed.client, "tcp", _svc_ip(family, 10), 80),
            "external IP TCP": bed.send(bed.client, "tcp", str(a["ext"]), 80),
            "NodePort TCP": bed.send(bed.client, "tcp", str(a["node"]), 30080),
            "ClusterIP UDP": bed.send(bed.client, "udp", _svc_ip(family, 14), 53),
        }
        for what, got in flows.items():
            out[f"{family} {what}"] = True if got and all(isinstance(r, dict) and r["pod"] == "a" for r in got) else got
    return out


def canary_answers(bed: Bed) -> bool | None:
    got = [bed.send(bed.client, "tcp", ip, 86, timeout=1.0) for ip in CANARY_IPS]
    return True if all(r and isinstance(r[0], dict) and r[0]["pod"] == "b" for r in got) else None


def _polling(node: Node, check: Callable[[], Any]) -> Callable[[], Any]:
    def checked() -> Any:
        node.check_alive()
        return check()

    return checked


def hostile_round(bed: Bed, mode: str, node: Node) -> None:
    """The world, then the hostile objects: the checks of the module's docstring."""

    def canary_round(change: Callable[[], None]) -> None:
        """The canary in, then `change` and the canary out in one step, until its rules are gone."""
        node.put("canary", canary())
        poll("the canary answering", _polling(node, lambda: canary_answers(bed)), timeout=60)
        change()
        node.drop("canary")

        def canary_gone() -> bool:
            return not any(ip in text for text in rules(bed, mode).values() for ip in CANARY_IPS)

        poll("the canary's rules gone", _polling(node, canary_gone), timeout=60)

    # The world alone: its rules, reached the same way as the hostile round's, are the reference.
    canary_round(lambda: None)
    before = answers(bed)
    assert all(v is True for v in before.values()), before
    reference = rules(bed, mode)
    for tool, text in reference.items():
        assert foreign_text(text) == [], tool  # so that "the same as before" below says "none of it"
    assert any(_svc_ip(Family.IPV6, 10) in text for text in reference.values())  # it shows the world

    # The hostile objects arrive and the node's own Node gets the injection.
    objs, expected = hostile()
    started = time.time()

    def hostile_change() -> None:
        node.put("hostile", objs)
        node.put("cluster", [injected_node(), *world()[1:]])

    canary_round(hostile_change)
    text = node.log()
    lines = text.splitlines()
    for kind, ref, field_ in [*expected, ("Node", NODE, "status.addresses[2].address")]:
        assert any(f"{kind} {ref}:" in line and field_ in line for line in lines), (kind, ref, field_, last_lines(text))
    assert "Traceback" not in text and "sync failed" not in text.lower(), last_lines(text)

    after = rules(bed, mode)
    for tool, got in after.items():
        assert foreign_text(got) == [], (tool, foreign_text(got))
        assert got == reference[tool], tool  # exactly the world's rules: nothing added, nothing lost
    if mode == "iptables":
        for tool in ("iptables", "ip6tables"):
            filter_input = bed.node.run([tool, "-S", "INPUT"]).stdout.splitlines()
            assert all("KUBE-" in rule or rule.startswith("-P ") for rule in filter_input), (tool, filter_input)
            services = bed.node.run([tool, "-t", "nat", "-S", "KUBE-SERVICES"]).stdout
            assert "-A KUBE-SERVICES -j RETURN" not in services.splitlines(), tool
    else:
        tables = bed.node.run(["nft", "list", "tables"]).stdout.split("\n")
        assert sorted(t for t in tables if t) == ["table ip kube-proxy", "table ip6 kube-proxy"], tables

    now = answers(bed)
    assert all(v is True for v in now.values()), now
    status, body = node.get("healthz")
    assert status == 200, body
    values = metrics(node)
    failures = ("kubeproxy_sync_proxy_rules_iptables_restore_failures_total",
                "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total",
                "kubeproxy_sync_proxy_rules_nftables_sync_failures_total")  # fmt: skip
    for family in FAMILIES:
        assert family_metric(values, "kubeproxy_sync_proxy_rules_last_timestamp_seconds", family) > started, family
        assert [family_metric(values, name, family) for name in failures] == [0.0, 0.0, 0.0], family
    node.check_alive()


@pytest.mark.parametrize("mode", MODES)
def test_hostile_addresses_from_manifests_never_reach_the_kernel(bed: Bed, mode: str, tmp_path: Path) -> None:
    with file_node(bed, mode, tmp_path, world()) as node:
        hostile_round(bed, mode, node)


@pytest.mark.parametrize("mode", MODES)
def test_hostile_addresses_from_the_api_server_never_reach_the_kernel(
    bed: Bed, mode: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    cfg = replace(CFG, mode=mode, healthz_bind_address="127.0.0.1:0", metrics_bind_address="127.0.0.1:0")

    async def main() -> None:
        with ApiServer() as server:
            for obj in world():
                server.apply(obj)
            proxy = LiveProxy(cfg, NODE, run_cmd=bed.node)
            client = connect(load_config(server.write_kubeconfig(tmp_path / "kubeconfig")))
            # wired as `kubeproxy run` wires it (proxy/kube_proxy.py): lists as one batch, typed where they fit
            source = ApiSource(client, NODE, proxy.on_event, batch_sink=proxy.on_events, typed_lists=True)
            task = asyncio.create_task(proxy.serve(source))
            try:
                await asyncio.wait_for(proxy.wait_for_syncs(1), 30)
                node = ApiNode(server, proxy, caplog, task, {"cluster": [("Node", "", NODE)]})
                await asyncio.to_thread(hostile_round, bed, mode, node)
                assert proxy.failed_syncs == 0
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                await client.aclose()

    asyncio.run(main())

"""The live SNAT gauge without a kernel: the tuple counting of a ctnetlink batch, the scale of a
cut-short dump, the metrics and the one-warning-per-crossing logic (the kernel test is
test_snat_watch_kernel.py)."""

from __future__ import annotations

import ipaddress
import json
import logging
import struct
import subprocess
from collections import Counter
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kubeproxy.backends.conntrack import ctnetlink
from kubeproxy.model.node_model import build_view
from kubeproxy.model.options import Family
from kubeproxy.proxy.snat_watch import SNAT_PORTS, SnatWatch, sample_dump
from tests.doctor.helpers import dns_world, state_of


def _attr(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def _tuple(src: str, dst: str, proto: int, sport: int, dport: int) -> bytes:
    """A tuple nest as the kernel's ctnetlink_dump_tuples writes it."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    v6 = s.version == 6
    ip = _attr(3 if v6 else 1, s.packed) + _attr(4 if v6 else 2, d.packed)
    pr = _attr(1, bytes([proto])) + _attr(2, struct.pack("!H", sport)) + _attr(3, struct.pack("!H", dport))
    return _attr(1 | 0x8000, ip) + _attr(2 | 0x8000, pr)


def _message(orig: tuple[str, str, int, int, int], reply: tuple[str, str, int, int, int]) -> bytes:
    body = struct.pack("=BBH", 2, 0, 0) + _attr(1 | 0x8000, _tuple(*orig)) + _attr(2 | 0x8000, _tuple(*reply))
    body += _attr(3, struct.pack("!I", 0x18e))  # CTA_STATUS, so the tuples are not the message's end
    return struct.pack("=IHHII", 16 + len(body), 0x100, 2, 1, 0) + body


def test_count_tuples_finds_reply_tuples_to_the_node_of_each_family_and_protocol() -> None:
    chunk = b"".join([
        _message(("198.51.100.7", "203.0.113.53", 17, 4000 + i, 53), ("10.244.1.10", "192.168.0.2", 17, 53, 4000 + i))
        for i in range(5)
    ] + [
        # a pod client, not masqueraded: its reply goes to the pod, not the node
        _message(("10.244.1.20", "10.96.0.10", 17, 5000, 53), ("10.244.1.10", "10.244.1.20", 17, 53, 5000)),
        # TCP to the same endpoint port, and an IPv6 flow masqueraded to the node's IPv6 address
        _message(("198.51.100.7", "203.0.113.53", 6, 4000, 53), ("10.244.1.10", "192.168.0.2", 6, 53, 4000)),
        _message(("2001:db8::7", "fd00::53", 17, 4000, 53), ("fd00:10:244::10", "fd00::2", 17, 53, 4000)),
    ])
    counts: Counter[ctnetlink.Key] = Counter()
    ctnetlink.count_tuples(chunk, ctnetlink.tuple_patterns({"192.168.0.2", "fd00::2"}, ("udp",)), counts)
    assert counts == {("10.244.1.10", "192.168.0.2", "udp", 53): 5, ("fd00:10:244::10", "fd00::2", "udp", 53): 1}
    counts.clear()
    ctnetlink.count_tuples(chunk, ctnetlink.tuple_patterns({"192.168.0.2"}, ("tcp", "udp")), counts)
    assert counts == {("10.244.1.10", "192.168.0.2", "udp", 53): 5, ("10.244.1.10", "192.168.0.2", "tcp", 53): 1}


def test_a_cut_short_dump_is_scaled_to_the_table() -> None:
    state = state_of(dns_world(pods=2))
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-1")
    targets = {"10.244.1.10:53": [n for n in view.services], "10.244.1.11:53": [n for n in view.services]}
    d = ctnetlink.Dump(Counter({("10.244.1.10", "192.168.0.2", "udp", 53): 300, ("10.244.1.11", "10.0.0.9", "udp", 53): 50}),
                       entries=1_000, complete=False, total=10_000)
    gauges = sample_dump(d, targets, {"192.168.0.2"})
    assert [(g.endpoint, g.in_use) for g in gauges] == [("10.244.1.10:53", 3_000), ("10.244.1.11:53", 0)]
    assert ctnetlink.Dump(entries=5, total=10).scale == 1.0  # a whole dump is exact


def _ip_addr(argv: Any, **_: Any) -> subprocess.CompletedProcess[str]:
    assert list(argv[:3]) == ["ip", "-j", "addr"]
    links = [{"ifname": "lo", "addr_info": [{"local": "127.0.0.1", "scope": "host"}]},
             {"ifname": "eth0", "addr_info": [{"local": "192.168.0.2", "scope": "global"},
                                              {"local": "fe80::1", "scope": "link"}]}]
    return subprocess.CompletedProcess(argv, 0, json.dumps(links), "")


def test_the_watch_exports_the_worst_endpoint_and_warns_once_per_crossing(caplog: pytest.LogCaptureFixture) -> None:
    state = state_of(dns_world(pods=2))
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-1")
    in_use = {"n": 100}
    asked: list[set[str]] = []

    def fake_dump(dsts: set[str], protos: tuple[str, ...], **_: Any) -> ctnetlink.Dump:
        asked.append(set(dsts))
        return ctnetlink.Dump(Counter({("10.244.1.10", "192.168.0.2", "udp", 53): in_use["n"],
                                       ("10.244.1.11", "192.168.0.2", "udp", 53): 7}), entries=in_use["n"] + 7)

    registry = CollectorRegistry()
    watch = SnatWatch(lambda: [view], registry, threshold=0.5, run_cmd=_ip_addr, dump=fake_dump)
    caplog.set_level(logging.INFO, "kubeproxy.snat")
    watch.sample_once()
    assert asked == [{"192.168.0.2"}]  # global addresses only: where masquerade maps flows
    label = {"service": "default/dns:dns"}
    assert registry.get_sample_value("kubeproxy_snat_ports_in_use", label) == 100
    assert registry.get_sample_value("kubeproxy_snat_port_utilization", label) == pytest.approx(100 / SNAT_PORTS)
    assert registry.get_sample_value("kubeproxy_snat_ports") == SNAT_PORTS
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    in_use["n"] = 40_000  # past half of the ports
    watch.sample_once()
    watch.sample_once()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "default/dns:dns" in warned[0] and "10.244.1.10:53" in warned[0], warned
    in_use["n"] = 10
    watch.sample_once()
    assert any("back below" in r.getMessage() for r in caplog.records)
    in_use["n"] = 40_000
    watch.sample_once()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
    # a Service that is gone (or no longer masqueraded) leaves the metric
    watch.views = lambda: []
    watch.sample_once()
    assert registry.get_sample_value("kubeproxy_snat_ports_in_use", label) is None


def test_no_masqueraded_service_means_no_dump() -> None:
    state = state_of(dns_world(etp="Local"))
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-1")

    def no_dump(*_: Any, **__: Any) -> ctnetlink.Dump:
        raise AssertionError("dumped conntrack with nothing to watch")

    watch = SnatWatch(lambda: [view], CollectorRegistry(), run_cmd=_ip_addr, dump=no_dump)
    assert watch.sample_once() == []


def test_a_failing_sample_is_logged_once_and_never_stops_the_watch(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    state = state_of(dns_world())
    view = build_view(state.services.values(), state.slices.values(), Family.IPV4, "node-1")
    calls = {"n": 0}

    def failing(*_: Any, **__: Any) -> ctnetlink.Dump:
        calls["n"] += 1
        raise ctnetlink.DumpError(1, "ctnetlink socket: Operation not permitted")

    watch = SnatWatch(lambda: [view], CollectorRegistry(), interval=0.001, run_cmd=_ip_addr, dump=failing)

    async def body() -> None:
        task = asyncio.create_task(watch.run())
        while calls["n"] < 5:
            assert not task.done()  # the error did not end the loop
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(body(), 10))
    assert len([r for r in caplog.records if "SNAT sample failed" in r.getMessage()]) == 1


def test_the_run_flags_set_the_watch_and_bad_values_are_named() -> None:
    from kubeproxy.model.proxy_config import ConfigError
    from kubeproxy.proxy import flags

    inv = flags.resolve(flags.parse(["--snat-watch", "15s", "--snat-watch-threshold=0.5",
                                     "--snat-watch-max-entries", "5000"]))
    assert (inv.cfg.snat_watch_interval, inv.cfg.snat_watch_threshold, inv.cfg.snat_watch_max_entries) == (15, 0.5, 5000)
    assert flags.resolve(flags.parse([])).cfg.snat_watch_interval == 0  # off unless asked for
    with pytest.raises(ConfigError, match=r"--snat-watch-threshold=1\.5"):
        flags.resolve(flags.parse(["--snat-watch", "1s", "--snat-watch-threshold", "1.5"]))
    assert "--snat-watch" in flags.usage("kubeproxy run")

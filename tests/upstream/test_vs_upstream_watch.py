"""bench/vs_upstream.py's view of the kernel: bench/kernel_watch.py sees a rule as the kernel
commits it (nf_tables events, the legacy nat table's size), and the restore wrapper logs and
keeps what it runs, in namespaces made here."""

from __future__ import annotations

import importlib
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from kubeproxy.lab import netns as L
from tests.paths import REPO


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        yield importlib.import_module("vs_upstream")
    finally:
        sys.path.remove(str(REPO / "bench"))


@pytest.fixture(scope="module")
def watch() -> Iterator[ModuleType]:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        yield importlib.import_module("kernel_watch")
    finally:
        sys.path.remove(str(REPO / "bench"))


def _attr(kind: int, payload: bytes) -> bytes:
    padded = payload + bytes(-len(payload) % 4)
    return struct.pack("HH", 4 + len(payload), kind) + padded


def test_a_set_element_s_key_is_decoded_as_address_protocol_and_port(watch: ModuleType) -> None:
    key = bytes([10, 97, 0, 5]) + bytes([6, 0, 0, 0]) + struct.pack(">H", 80) + bytes(2)
    nested = 0x8000  # NLA_F_NESTED: masked off when reading
    element = _attr(nested | 1, _attr(nested | 1, _attr(1, key)))  # LIST_ELEM > KEY > DATA_VALUE
    payload = _attr(2, b"service-ips\0") + _attr(nested | 3, element)
    assert [watch.describe_key(k) for k in watch.element_keys(payload)] == ["10.97.0.5 tcp 80"]


def test_a_key_of_another_shape_is_not_described(watch: ModuleType) -> None:
    assert watch.describe_key(bytes([10, 0, 0, 1])) is None


def test_the_restore_log_gives_ipv4_restores_in_seconds_from_the_fork(bench: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "restores.log"
    log.write_text("1000.5 1000.75 1003.0 32000 400 0 iptables-restore 2.5\n1001.0 1001.0 1001.5 10 2 0 ip6tables-restore 0.1\n")
    assert bench.read_restores(log, 1000.0) == [(0.5, 0.75, 3.0, 32000, 400, 2.5)]
    assert bench.read_restores(tmp_path / "none.log", 1000.0) == []


def test_the_rule_awaited_is_the_map_element_in_nftables_and_the_service_chain_in_iptables(bench: ModuleType) -> None:
    assert bench.rule_key("nftables", "svc-1", "10.97.0.2") == "elem 10.97.0.2 tcp 80"
    chain = bench.service_chain("bench/svc-1:http", "tcp")
    assert bench.rule_key("iptables-legacy", "svc-1", "10.97.0.2") == f"chain {chain}"


@pytest.mark.root
def test_the_watcher_sees_an_nftables_element_as_it_is_committed(bench: ModuleType) -> None:
    with L.netns("kpwatch") as ns:
        watcher = bench.KernelWatch(ns, "nftables")
        try:
            sent = time.monotonic()
            ns.run(["nft", "-f", "-"], input="table ip kube-proxy {\n chain service-a { }\n map service-ips {"
                   " type ipv4_addr . inet_proto . inet_service : verdict;"
                   " elements = { 10.97.0.5 . tcp . 80 : goto service-a } }\n}\n")  # fmt: skip
            done = time.monotonic()
            proxy = subprocess.Popen(["sleep", "60"], text=True)  # stands for the proxy: alive
            try:
                seen = watcher.await_rule(proxy, "nftables", "svc", "10.97.0.5", time.monotonic() + 30)
            finally:
                L.stop_process(proxy, 5)
            assert sent <= seen <= done + 1.0  # stamped as the watcher reads the event
            assert watcher.seen.get("chain service-a") is not None
            assert not watcher.lost
        finally:
            watcher.stop()


@pytest.mark.root
def test_the_watcher_sees_a_legacy_service_chain_once_restored(bench: ModuleType, tmp_path: Path) -> None:
    chain = bench.service_chain("bench/svc-2:http", "tcp")
    path, multi = bench.iptables_path(tmp_path / "bin", "xtables-legacy-multi")
    log, keep = tmp_path / "restores.log", tmp_path / "keep"
    keep.mkdir()
    with L.netns("kpwatch") as ns:
        watcher = bench.KernelWatch(ns, "iptables-legacy")
        try:
            sent, sent_wall = time.monotonic(), time.time()
            text = f"*nat\n:{chain} - [0:0]\n-A {chain} -j RETURN\nCOMMIT\n"
            env = ["env", f"PATH={path}", f"KP_RESTORE_LOG={log}", f"KP_XTABLES_MULTI={multi}", f"KP_RESTORE_KEEP={keep}"]
            ns.run([*env, "iptables-restore", "-w", "--noflush"], input=text)
            done = time.monotonic()
            proxy = subprocess.Popen(["sleep", "60"], text=True)
            try:
                seen = watcher.await_rule(proxy, "iptables-legacy", "svc-2", "10.97.0.6", time.monotonic() + 30)
            finally:
                L.stop_process(proxy, 5)
            # the 2 ms poll may see the commit just after the tool has returned
            assert sent <= seen <= done + 1.0
            ((began, start, end, size, lines, cpu),) = bench.read_restores(log, sent_wall)
            assert 0 <= began <= start <= end and (size, lines) == (len(text), 4) and cpu >= 0
            assert [p.read_text() for p in keep.iterdir()] == [text]
            assert bench.rule_present(ns, "iptables-legacy", path, "svc-2", "10.97.0.6")
        finally:
            watcher.stop()


@pytest.mark.root
def test_a_proxy_that_exits_ends_the_wait_at_once(bench: ModuleType) -> None:
    with L.netns("kpwatch") as ns:
        watcher = bench.KernelWatch(ns, "nftables")
        try:
            proxy = subprocess.Popen(["true"], text=True)
            proxy.wait()
            with pytest.raises(bench.EarlyExit):
                watcher.await_rule(proxy, "nftables", "svc", "10.97.0.7", time.monotonic() + 300)
        finally:
            watcher.stop()

"""`kubeproxy demo`: live as root (a MiniCluster, `kubeproxy run`, real traffic), the offline
rendering otherwise. The live demo's tables are checked row by row: each scenario's outcome is
what the pods really saw, so a proxy that stopped masquerading, kept a remote endpoint for a Local
service or missed the scale-up would fail here."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from kubeproxy.lab import netns
from kubeproxy.lab.cluster import kubeproxy_binary

OFFLINE_TITLE = "What each service port becomes on this node"
FALLBACK = (
    "kubeproxy demo: the live demo needs root (it builds network namespaces and programs iptables in them); "
    "showing the offline demo instead (kubeproxy demo --offline)."
)


def _env() -> dict[str, str]:
    # wide enough that no table cell wraps: one row per line
    return {**os.environ, "COLUMNS": "300"}


def _row(out: str, *markers: str) -> str:
    rows = [line for line in out.splitlines() if all(m in line for m in markers)]
    assert len(rows) == 1, f"expected one row with {markers}, found {len(rows)}:\n{out}"
    return rows[0]


@pytest.mark.root
@pytest.mark.timeout(60)
def test_live_demo_shows_each_outcome_and_cleans_up() -> None:
    proc = subprocess.Popen([kubeproxy_binary(), "demo"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, f"{out}\n{err}"
    assert OFFLINE_TITLE not in out and "offline demo instead" not in out

    web = _row(out, "pod toolbox 10.244", "10.96.10.10:80/tcp")
    assert "web-1 ×" in web and "web-2 ×" in web and "(pod toolbox: its own)" in web, web
    assert "dns-1 ×3" in _row(out, "10.96.0.53:53/udp") and "its own" in _row(out, "10.96.0.53:53/udp")
    for dst in ("203.0.113.53:53/udp", "192.168.0.2:30054/tcp"):
        row = _row(out, dst)
        assert "dns-1 ×3" in row and "192.168.0.2 (the node: masqueraded)" in row, row
    shop = _row(out, "198.51.100.7:443/tcp")
    assert "shop-1 ×6" in shop and "shop-2" not in shop and "192.168.0.11 (the real client IP, kept)" in shop, shop
    assert "refused ×2" in _row(out, "10.96.40.40:80/tcp")

    health = _row(out, "http://192.168.0.2:32000/")
    assert "│ 200 " in health and "localEndpoints 1" in health, health
    healthz = _row(out, "http://192.168.0.2:10256/healthz")
    assert "│ 200 " in healthz and "healthy True" in healthz, healthz

    during = _row(out, "(while it changed)")
    after = _row(out, "(after the change)")
    assert " 0 failed" in during and " 0 failed" in after, (during, after)
    assert "web-3 ×" in after, after

    assert "cleaned up:" in out
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"-{proc.pid}-" not in listed, listed  # the demo's namespaces are named after its pid


def test_without_root_it_says_why_and_shows_the_offline_demo() -> None:
    argv = [kubeproxy_binary(), "demo"]
    if netns.have_root():
        if shutil.which("setpriv") is None:
            pytest.skip("as root, this needs setpriv (util-linux) to run the demo as nobody")
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == FALLBACK
    assert OFFLINE_TITLE in proc.stdout and "iptables-restore input" in proc.stdout


def test_offline_on_request() -> None:
    proc = subprocess.run([kubeproxy_binary(), "demo", "--offline"], capture_output=True, text=True, env=_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "live demo" not in proc.stdout and "kubeproxy demo: a live node" not in proc.stdout
    assert OFFLINE_TITLE in proc.stdout and "default/gone" in proc.stdout

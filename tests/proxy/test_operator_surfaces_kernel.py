"""The real `kube-proxy` process, in a namespace, against the test API server: what its metrics
port shows an operator (/configz, /flagz, /statusz, the component and client metrics), as
upstream v1.37.2 shows it (tests/fixtures/upstream_operator/)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kubeproxy.lab.netns import NetNS
from kubeproxy.proxy import flags
from kubeproxy.proxy.config import to_kube_proxy_configuration

pytestmark = pytest.mark.root
BIN = Path(sys.executable).parent
API_PORT = 18080


def _wait_for(proc: subprocess.Popen[str], text: str) -> None:
    """Until `proc` logs `text`; then its log is drained in the background, so that a full pipe
    never stops it."""
    stderr = proc.stderr
    assert stderr is not None
    for line in stderr:
        if text in line:
            threading.Thread(target=stderr.read, daemon=True).start()
            return
    raise AssertionError(f"{proc.args!r} exited with {proc.wait()} before logging {text!r}")


def _get(ns: NetNS, path: str, accept: str = "") -> str:
    argv = ["curl", "-sS", "--max-time", "10", *(["-H", f"Accept: {accept}"] if accept else []), f"http://127.0.0.1:10249{path}"]
    return ns.run(argv).stdout


@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_the_metrics_port_shows_what_upstream_shows(netns: NetNS, mode: str) -> None:
    netns.run(["ip", "link", "set", "lo", "up"])
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    api = netns.popen([str(BIN / "python"), "-m", "kubeproxy.lab.apiserver", "--port", str(API_PORT)],
                      stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)  # fmt: skip
    _wait_for(api, "test API server listening")
    args = [f"--master=http://127.0.0.1:{API_PORT}", "--kube-api-content-type=application/json",
            "--hostname-override=node-a", f"--proxy-mode={mode}", "-v=2", "--cluster-cidr=10.244.0.0/16"]  # fmt: skip
    proxy = netns.popen([str(BIN / "kube-proxy"), *args], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    _wait_for(proxy, "SyncProxyRules complete")

    configz = json.loads(_get(netns, "/configz"))
    expected = to_kube_proxy_configuration(flags.resolve(flags.parse(args)).cfg)
    assert list(configz) == ["kubeproxy.config.k8s.io"] and configz["kubeproxy.config.k8s.io"] == expected

    flagz = _get(netns, "/flagz")
    assert flagz.startswith("\nkube-proxy flagz\nWarning: ")
    assert f"\nproxy-mode:{mode}\n" in flagz and f"\nmaster:http://127.0.0.1:{API_PORT}\n" in flagz

    statusz = json.loads(_get(netns, "/statusz", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io"))
    assert statusz["paths"] == ["/configz", "/flagz", "/healthz", "/metrics", "/proxyMode"]
    assert (statusz["binaryVersion"], statusz["emulationVersion"]) == ("1.37.2", "1.37")

    metrics = _get(netns, "/metrics")
    host = f"127.0.0.1:{API_PORT}"
    assert re.search(rf'^rest_client_requests_total\{{code="200",host="{host}",method="GET"\}} [1-9]', metrics, re.M)
    # Watches are not timed (client-go times requests, not streams) and the start-up is all
    # watch-lists here, so the histogram may hold no sample yet: it is declared as upstream's.
    assert "# TYPE rest_client_request_duration_seconds histogram" in metrics
    assert re.search(r'^kubernetes_build_info\{.*git_version="v1\.37\.2".*\} 1', metrics, re.M)
    assert 'kubernetes_feature_enabled{name="NFTablesProxyMode",stage=""} 1' in metrics

"""The test API server and the tracer are packages of one-job modules; what callers import from
`kubeproxy.lab.apiserver` and `kubeproxy.netfilter.simulate` still works, and so does
`python -m kubeproxy.lab.apiserver`, which the lab starts in its node namespace."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.timeout(60)


def test_the_names_callers_import_are_still_there() -> None:
    from kubeproxy.lab import apiserver
    from kubeproxy.netfilter import simulate

    for name in (
        "ApiServer", "ApiError", "DEFAULT_RESOURCES", "DEPLOY_RESOURCES", "SERVICE", "NAMESPACE", "Selector",
        "merge_patch", "strategic_merge_patch", "json_patch", "selector_matches", "status_object",
        "too_large_resource_version", "admit", "Store", "main",
    ):  # fmt: skip
        assert hasattr(apiserver, name), name
    assert set(apiserver.__all__) <= set(dir(apiserver))
    for name in ("trace", "Simulator", "Outcome", "TraceResult", "TraceError", "Hop"):
        assert hasattr(simulate, name), name
    assert set(simulate.__all__) <= set(dir(simulate))


def test_python_dash_m_serves_and_writes_a_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    argv = [sys.executable, "-m", "kubeproxy.lab.apiserver", "--kubeconfig", str(kubeconfig), "--deploy-kinds"]
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stderr is not None
            # The server logs the kubeconfig's path once it is listening and the file is written.
            for line in proc.stderr:
                if "kubeconfig written" in line:
                    break
            else:
                pytest.fail(f"the server exited ({proc.wait()}) before writing its kubeconfig")
            server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
            with urllib.request.urlopen(f"{server}/apis", timeout=10) as answer:
                groups = {g["name"] for g in json.load(answer)["groups"]}
            # --deploy-kinds: the workload and RBAC groups are served besides discovery.k8s.io.
            assert {"apps", "discovery.k8s.io", "rbac.authorization.k8s.io"} <= groups
        finally:
            proc.terminate()
    assert proc.returncode is not None

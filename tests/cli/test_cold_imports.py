"""What `kubeproxy run` and `kubeproxy render` load at start (cold start): YAML only for
YAML (a manifest, --config, --write-config-to), the rules model only for `kubeproxy trace`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kubeproxy.cli import DUMP_FORMATS
from kubeproxy.netfilter import detect

PROBE = """
import sys
import kubeproxy.cli, kubeproxy.proxy.kube_proxy, kubeproxy.proxy.config, kubeproxy.proxy.startup
from pathlib import Path
from kubeproxy.cluster.manifests import parse_documents, read_text
objects = list(parse_documents(read_text(Path(sys.argv[1])), sys.argv[1]))
assert [o.obj["metadata"]["name"] for o in objects] == ["a"], objects
print(",".join(sorted(m for m in ("yaml", "kubeproxy.netfilter.ruleset") if m in sys.modules)))
"""

SERVICE = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "a", "namespace": "default"},
           "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}}  # fmt: skip


def loaded_after_parsing(path: Path) -> str:
    return subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, check=True).stdout.strip()


def test_a_json_manifest_loads_neither_yaml_nor_the_rules_model(tmp_path: Path) -> None:
    path = tmp_path / "svc.json"
    path.write_text(json.dumps(SERVICE))
    assert loaded_after_parsing(path) == ""


def test_a_yaml_manifest_still_parses_with_yaml(tmp_path: Path) -> None:
    path = tmp_path / "svc.yaml"
    path.write_text("apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: default}\n"
                    "spec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}\n")  # fmt: skip
    assert loaded_after_parsing(path) == "yaml"


def test_the_trace_formats_are_the_detectors() -> None:
    assert DUMP_FORMATS == detect.FORMATS

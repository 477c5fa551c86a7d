"""Reading manifest files: folders, JSON and YAML, what is skipped."""

from __future__ import annotations

import json
from pathlib import Path

from kubeproxy.cluster.manifests import load_manifests, manifest_files

SVC = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"}}


def test_mounted_configmap_folder_is_read_once(tmp_path: Path) -> None:
    # What kubelet makes of a ConfigMap volume: real files in a hidden timestamped folder,
    # `..data` pointing at it, and visible symlinks through `..data`.
    real = tmp_path / "..2026_11_23_10_00_00.123"
    real.mkdir()
    (real / "svc.json").write_text(json.dumps(SVC))
    (tmp_path / "..data").symlink_to(real.name)
    (tmp_path / "svc.json").symlink_to("..data/svc.json")
    assert manifest_files([tmp_path]) == [tmp_path / "svc.json"]
    assert [r.obj["metadata"]["name"] for r in load_manifests([tmp_path])] == ["web"]


def test_json_and_yaml_flow_style_both_parse(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(SVC))
    (tmp_path / "b.yaml").write_text("{kind: Service, apiVersion: v1, metadata: {name: flow, namespace: default}}\n")
    assert [r.obj["metadata"]["name"] for r in load_manifests([tmp_path])] == ["web", "flow"]

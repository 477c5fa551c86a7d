"""kubeadm's own kube-proxy DaemonSet and ConfigMap (deploy/kubeadm/kube-proxy.yaml, as kubeadm
writes them) start kubeproxy unchanged: only the image differs.

Offline: the container command parses with our command line and the ConfigMap's config.conf
loads, giving upstream's defaults where kubeadm writes null, "" and 0s. Live (root): that exact
command, in a mount namespace where /var/lib/kube-proxy holds the ConfigMap's keys as the
kubelet mounts them, runs in the bed's node namespace against the test API server; kubectl
creates a Service and the client's packets reach the pods through a NodePort and the ClusterIP.
"""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubeproxy import __version__
from kubeproxy.lab.builders import Port, endpoint_slice, service
from kubeproxy.lab.cluster import NODE_IP, NODE_NAME, MiniCluster, poll
from kubeproxy.proxy.flags import parse, resolve
from kubeproxy.proxy.startup import config_warnings
from tests.paths import REPO

ROOT = REPO
KUBEADM = ROOT / "deploy" / "kubeadm"
JSON = dict[str, Any]


def kubeadm_objects() -> dict[str, JSON]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((KUBEADM / "kube-proxy.yaml").read_text()) if doc}


def container(ds: JSON) -> JSON:
    c: JSON
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    return c


def expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """The kubelet's $(VAR) expansion of a container command."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in argv]


def mount_configmap(cm: JSON, folder: Path) -> Path:
    """The ConfigMap's keys as files, as the kubelet mounts a configMap volume."""
    folder.mkdir(parents=True, exist_ok=True)
    for key, text in cm["data"].items():
        (folder / key).write_text(text)
    return folder


def test_kubeadm_command_and_configmap_parse_unchanged(tmp_path: Path) -> None:
    objs = kubeadm_objects()
    ds, cm = objs["DaemonSet"], objs["ConfigMap"]
    c = container(ds)
    argv = expand(c["command"], {"NODE_NAME": "node-7"})
    # kubeadm runs /usr/local/bin/kube-proxy: our image's entry point, the console script of the package.
    assert argv[0] == "/usr/local/bin/kube-proxy"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kube-proxy"] == "kubeproxy.cli:kube_proxy"
    assert 'ENTRYPOINT ["/usr/local/bin/kube-proxy"]' in (ROOT / "deploy" / "Containerfile").read_text()
    # The ConfigMap volume holds config.conf and kubeconfig.conf at /var/lib/kube-proxy.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["kube-proxy"]["configMap"]["name"] == cm["metadata"]["name"]
    folder = mount_configmap(cm, tmp_path / "var-lib-kube-proxy")
    args = [arg.replace(mounts["kube-proxy"], str(folder)) for arg in argv[1:]]
    resolved = resolve(parse(args))
    cfg = resolved.cfg
    assert resolved.warnings == ()
    # kubeadm's nulls, "" and 0s are upstream's defaults.
    assert (cfg.mode, cfg.hostname_override, cfg.cluster_cidr) == ("iptables", "node-7", ("10.244.0.0/16",))
    assert (cfg.healthz_bind_address, cfg.metrics_bind_address) == ("0.0.0.0:10256", "127.0.0.1:10249")
    assert (cfg.sync_period, cfg.min_sync_period, cfg.masquerade_bit, cfg.localhost_nodeports) == (30, 1, 14, True)
    assert (cfg.conntrack.max_per_core, cfg.conntrack.min) == (32768, 131072)
    assert (cfg.conntrack.tcp_established_timeout, cfg.conntrack.tcp_close_wait_timeout) == (86400, 3600)
    assert (cfg.conntrack.udp_timeout, cfg.oom_score_adj, cfg.config_sync_period) == (0, -999, 900)
    assert cfg.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"
    # Nothing kubeadm writes is set to something we ignore: only upstream's own nodePortAddresses advice.
    assert [w for w in config_warnings(cfg) if "nodePortAddresses is unset" not in w] == []


def test_the_swap_changes_the_image_and_nothing_else() -> None:
    ds = kubeadm_objects()["DaemonSet"]
    patch = yaml.safe_load((KUBEADM / "image-patch.yaml").read_text())
    (patched_container,) = patch["spec"]["template"]["spec"]["containers"]
    assert patched_container == {"name": container(ds)["name"], "image": f"localhost/kubeproxy:{__version__}"}
    swapped = copy.deepcopy(ds)
    container(swapped)["image"] = patched_container["image"]  # what the strategic merge patch does (by name)
    container(ds).pop("image"), container(swapped).pop("image")
    assert swapped == ds
    kustomization = yaml.safe_load((KUBEADM / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert image["name"] == "registry.k8s.io/kube-proxy" and kustomization["resources"] == ["kube-proxy.yaml"]
    assert f"{image['newName']}:{image['newTag']}" == patched_container["image"]
    assert f"-t {patched_container['image']}" in (ROOT / "deploy" / "Containerfile").read_text()


@pytest.mark.root
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH (CI installs it)")
@pytest.mark.timeout(180)
def test_kubeadm_daemonset_command_runs_the_node(tmp_path: Path) -> None:
    objs = kubeadm_objects()
    c = container(objs["DaemonSet"])
    argv = expand(c["command"], {"NODE_NAME": NODE_NAME})
    argv[0] = str(Path(sys.executable).parent / "kube-proxy")  # the image's /usr/local/bin/kube-proxy
    mount_path = next(m["mountPath"] for m in c["volumeMounts"] if m["name"] == "kube-proxy")
    with MiniCluster.build(pods=["a", "b"], remote_pods=()) as cluster:
        kubeconfig = cluster.start_apiserver()
        # The ConfigMap as the kubelet mounts it. kubeconfig.conf points at the test API server
        # (plain HTTP on the node's loopback) instead of kubeadm's TLS endpoint; config.conf is kubeadm's.
        cm = copy.deepcopy(objs["ConfigMap"])
        cm["data"]["kubeconfig.conf"] = kubeconfig.read_text()
        folder = mount_configmap(cm, tmp_path / "configmap")
        http = Port("http", 80, 8080, node_port=30080)
        cluster.kubectl_apply([
            cluster.node_object(),
            service("web", "10.96.0.10", [http], type="NodePort"),
            endpoint_slice("web", cluster.backends("a", "b"), [http]),
        ])
        # A private mount namespace: /var/lib/kube-proxy exists only for the proxy, the host's stays untouched.
        script = (
            f"mount -t tmpfs kubeadm-var-lib {shlex.quote(str(Path(mount_path).parent))} && "
            f"mkdir {shlex.quote(mount_path)} && mount --bind {shlex.quote(str(folder))} {shlex.quote(mount_path)} && "
            f"exec {shlex.join(argv)}"
        )
        log = cluster._log_file("proxy.log")
        cluster.proxy = cluster.node.popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                                           stdout=log, stderr=log)
        cluster.wait_endpoints("default/web:http", {f"{b.ip}:8080" for b in cluster.backends("a", "b")}, timeout=60)
        for dst in (f"{NODE_IP}:30080", "10.96.0.10:80"):
            got = cluster.request("tcp", cluster.client, dst, count=10)
            assert {r["dst"].split(":")[0] for r in got if isinstance(r, dict)} <= {b.ip for b in cluster.backends("a", "b")}
            assert all(isinstance(r, dict) for r in got), got
        def started() -> str | None:
            log = cluster.proxy_log()
            return log if "Starting kubeproxy" in log else None

        text = poll("the start-up line", started, timeout=15)
        line = next(line for line in text.splitlines() if "Starting kubeproxy" in line)
        assert f'node="{NODE_NAME}"' in line and 'nodeFrom="--hostname-override"' in line
        assert f'nodeIPs="{NODE_IP}"' in line and 'clusterCIDR="10.244.0.0/16"' in line
        assert 'localTrafficDetector="ClusterCIDR:10.244.0.0/16"' in line
        assert "API server" in line and "Traceback" not in text
        assert cluster.stop_proxy() in (0, -15)

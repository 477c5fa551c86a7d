"""The node image (deploy/image/build), proven from inside: its own kube-proxy, its own kernel
tools and its iptables wrapper, run through chroot in network namespaces made here.

The image is built once per session if missing or stale (a warm build only compares keys; a
cold one runs mmdebstrap, about a minute). Every test runs the image on a fresh overlay, as a
container runtime would: the wrapper's first-call choice never leaks from one test to the next.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from kubeproxy import __version__
from kubeproxy.lab import netns as L
from kubeproxy.lab.builders import JSON
from kubeproxy.lab.cluster import NODE_IP, MiniCluster, poll
from tests.e2e import scenarios

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "deploy" / "image" / "build"
LOCK = ROOT / "deploy" / "image" / "requirements.lock"
NODE_TOOLS = ("iptables-legacy-restore", "iptables-nft-restore", "ip6tables-legacy-save", "ip6tables-nft-save", "nft",
              "ipset", "ipvsadm", "conntrack", "nfacct", "modprobe", "ip")

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("apt-get") is None, reason="the image is built with Debian's mmdebstrap"),
]


@pytest.fixture(scope="session")
def rootfs() -> Path:
    proc = subprocess.run([str(BUILD)], capture_output=True, text=True, check=False, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass
class Image:
    """One running copy of the image: `root` is an overlay of the built tree, writable, thrown away."""

    root: Path

    def argv(self, *command: str) -> list[str]:
        return ["chroot", str(self.root), *command]

    def alternative(self, name: str) -> str:
        """Where the image's /etc/alternatives/NAME points (the wrapper, or the variant it chose)."""
        return str((self.root / "etc" / "alternatives" / name).readlink())


@pytest.fixture
def image(rootfs: Path, tmp_path: Path) -> Iterator[Image]:
    merged, upper, work = tmp_path / "merged", tmp_path / "upper", tmp_path / "work"
    for folder in (merged, upper, work):
        folder.mkdir()
    with ExitStack() as stack:
        mount = ["mount", "-t", "overlay", "overlay", "-o", f"lowerdir={rootfs},upperdir={upper},workdir={work}", str(merged)]
        subprocess.run(mount, check=True, capture_output=True)
        stack.callback(subprocess.run, ["umount", "-R", str(merged)], check=True, capture_output=True)
        subprocess.run(["mount", "-t", "proc", "proc", str(merged / "proc")], check=True, capture_output=True)
        yield Image(merged)


def share(image: Image, folder: Path) -> None:
    """Makes a host folder (the bed's manifests) visible at the same path inside the image."""
    inside = image.root / folder.relative_to("/")
    inside.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(folder), str(inside)], check=True, capture_output=True)


def test_kube_proxy_version_from_inside(image: Image) -> None:
    out = subprocess.run(image.argv("/usr/local/bin/kube-proxy", "--version"), capture_output=True, text=True, check=True)
    assert re.fullmatch(rf"Kubernetes v1\.\d+\.\d+ \(kubeproxy {re.escape(__version__)}\)\n", out.stdout), out.stdout


def test_the_image_holds_the_node_tools_and_exactly_the_locked_packages(image: Image) -> None:
    found = subprocess.run(image.argv("sh", "-c", 'for t in "$@"; do command -v "$t" || echo "missing $t"; done', "-",
                                      *NODE_TOOLS), capture_output=True, text=True, check=True).stdout
    assert "missing" not in found, found
    listing = "import importlib.metadata as m, json; print(json.dumps({d.name.lower(): d.version for d in m.distributions()}))"
    installed = json.loads(subprocess.run(image.argv("/opt/kubeproxy/bin/python", "-c", listing),
                                          capture_output=True, text=True, check=True).stdout)
    locked = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", LOCK.read_text(), re.MULTILINE))
    normal = {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in locked.items()}
    assert {re.sub(r"[-_.]+", "-", n): v for n, v in installed.items()} == {**normal, "kubeproxy": __version__}
    # The lab's extra (plots, tables) stays out of the node image.
    assert not {"matplotlib", "numpy", "pillow", "rich"} & set(installed)


# (what a node's kubelet left, in which variant) -> the variant the wrapper must choose.
SEEDS = {
    "kubelet-hint-in-nft": ([("nft", "-t mangle -N KUBE-IPTABLES-HINT")], "nft"),
    "kubelet-canary-in-legacy": ([("legacy", "-t mangle -N KUBE-KUBELET-CANARY")], "legacy"),
    "v6-canary-in-legacy": ([("legacy6", "-t mangle -N KUBE-KUBELET-CANARY")], "legacy"),
    # nft's kubelet chains are looked for first, whatever legacy holds
    "chains-in-both": ([("legacy", "-t mangle -N KUBE-KUBELET-CANARY"), ("legacy", "-A INPUT -j ACCEPT"),
                        ("nft", "-t mangle -N KUBE-IPTABLES-HINT")], "nft"),
    "more-legacy-rules": ([("legacy", "-A INPUT -j ACCEPT"), ("legacy", "-A FORWARD -j ACCEPT"),
                           ("nft", "-A INPUT -j ACCEPT")], "legacy"),
    "as-many-rules": ([("legacy", "-A INPUT -j ACCEPT"), ("nft", "-A INPUT -j ACCEPT")], "nft"),
    "nothing": ([], "nft"),
}
SEED_TOOL = {"legacy": "iptables-legacy", "nft": "iptables-nft", "legacy6": "ip6tables-legacy"}


def seed(ns: L.NetNS, rules: list[tuple[str, str]]) -> None:
    """The node's own rules, written with the host's iptables as a kubelet on the node would."""
    for variant, rule in rules:
        ns.run([SEED_TOOL[variant], *rule.split()])


def chains(ns: L.NetNS, variant: str, table: str) -> set[str]:
    text = ns.run([f"iptables-{variant}-save", "-t", table], check=False).stdout
    return set(re.findall(r"^:(\S+)", text, re.MULTILINE))


@pytest.mark.parametrize("case", SEEDS, ids=str)
def test_the_wrapper_follows_the_rules_the_node_has(image: Image, case: str) -> None:
    rules, expected = SEEDS[case]
    other = {"legacy": "nft", "nft": "legacy"}[expected]
    assert image.alternative("iptables-restore") == "/usr/sbin/iptables-wrapper"
    with L.netns("kpimg") as ns:
        seed(ns, rules)
        # The first call is a restore fed on stdin: the detection must leave its input alone.
        ns.run(image.argv("iptables-restore", "--noflush"), input="*filter\n:KP-IMAGE-TEST - [0:0]\nCOMMIT\n")
        assert "KP-IMAGE-TEST" in chains(ns, expected, "filter")
        assert "KP-IMAGE-TEST" not in chains(ns, other, "filter")
    for name in ("iptables", "ip6tables"):
        assert image.alternative(name) == f"/usr/sbin/{name}-{expected}"


def test_a_forced_variant_and_a_bad_one(image: Image) -> None:
    with L.netns("kpimg") as ns:
        bad = ns.run(["env", "KUBEPROXY_IPTABLES_MODE=both", *image.argv("iptables-save")], check=False)
        assert bad.returncode == 2 and "KUBEPROXY_IPTABLES_MODE=both: want legacy or nft" in bad.stderr
        assert image.alternative("iptables") == "/usr/sbin/iptables-wrapper"
        ns.run(["env", "KUBEPROXY_IPTABLES_MODE=legacy", *image.argv("iptables-save")])
    assert image.alternative("iptables") == "/usr/sbin/iptables-legacy"


# ---- one live scenario per mode, with the image's kube-proxy ---------------------------------

MODES = {
    "iptables-legacy": ("iptables", [("legacy", "-t mangle -N KUBE-IPTABLES-HINT")], "legacy"),
    "iptables-nft": ("iptables", [("nft", "-t mangle -N KUBE-IPTABLES-HINT")], "nft"),
    "nftables": ("nftables", [("nft", "-t mangle -N KUBE-IPTABLES-HINT")], ""),
}


@pytest.mark.parametrize("name", MODES, ids=str)
def test_the_images_kube_proxy_serves_a_node_port(image: Image, name: str) -> None:
    mode, rules, variant = MODES[name]
    with MiniCluster.build(pods=("a", "b"), remote_pods=("r",), proxy_mode=mode) as cluster:
        seed(cluster.node, rules)
        share(image, cluster.workdir)
        command = image.argv("/usr/local/bin/kube-proxy", "-v", "2")

        def load(objs: list[JSON]) -> None:
            cluster.write_manifests([cluster.node_object(), *objs])
            cluster.start_proxy(*scenarios.PROXY_ARGS, command=command)
            cluster.wait_synced()
            # The waits of the bed read the host's iptables; this proxy may write the other
            # variant, so the traffic itself says when the rules are in.
            node_port = f"{NODE_IP}:{scenarios.NODE_PORT}"
            poll("the node port to answer", lambda: isinstance(cluster.request("tcp", cluster.client, node_port)[0], dict),
                 timeout=15)

        scenarios.node_port_cluster_policy_masquerades(cluster, load)
        if variant:
            other = {"legacy": "nft", "nft": "legacy"}[variant]
            assert "KUBE-SERVICES" in chains(cluster.node, variant, "nat")
            assert "KUBE-SERVICES" not in chains(cluster.node, other, "nat")
            assert image.alternative("iptables") == f"/usr/sbin/iptables-{variant}"
        else:
            cluster.node.run(["nft", "list", "table", "ip", "kube-proxy"])
            assert "KUBE-SERVICES" not in chains(cluster.node, "legacy", "nat") | chains(cluster.node, "nft", "nat")
        assert "SyncProxyRules complete" in cluster.proxy_log()


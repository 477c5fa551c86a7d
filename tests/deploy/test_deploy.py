"""deploy/: the manifests and the image recipe that put kubeproxy on a real cluster.

What can be checked without a cluster or a container runtime is checked here: every document
parses and the objects refer to each other correctly; the DaemonSet's command parses with our
own CLI and its ConfigMap loads with our config loader; the RBAC rules are exactly what our API
source asks the server for (recorded from a live run against the test API server); the real
`kubectl apply --dry-run=server` accepts the manifests, stores nothing, and reports broken
copies the way a real server does; the Containerfile's packages provide the tools we run.
"""

from __future__ import annotations

import asyncio
import copy
import http.client
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubeproxy import __version__
from kubeproxy.lab.apiserver import DEPLOY_RESOURCES, ApiServer, selector_matches
from kubeproxy.model.proxy_config import ConfigError
from kubeproxy.proxy.config import load_config_file
from kubeproxy.proxy.flags import FlagError, parse, resolve
from kubeproxy.sources.api import ApiSource
from kubeproxy.sources.connection import connect, load_config
from tests.paths import REPO

ROOT = REPO
DEPLOY = ROOT / "deploy"
JSON = dict[str, Any]

# kind -> (apiVersion, name, namespace or "" for cluster-scoped kinds)
EXPECTED = {
    "ServiceAccount": ("v1", "kubeproxy", "kube-system"),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "kubeproxy", ""),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "kubeproxy", ""),
    "ConfigMap": ("v1", "kubeproxy", "kube-system"),
    "DaemonSet": ("apps/v1", "kubeproxy", "kube-system"),
}

needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH (CI installs it)")


def load_documents(folder: Path = DEPLOY) -> list[tuple[Path, JSON]]:
    """Every YAML document of every manifest in `folder`, as kubectl reads a folder (*.yaml, *.yml, *.json)."""
    docs = []
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml", ".json")):
        docs += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return docs


@pytest.fixture(scope="module")
def objects() -> dict[str, JSON]:
    by_kind: dict[str, JSON] = {}
    for path, doc in load_documents():
        assert doc.get("kind") not in by_kind, f"{path}: a second {doc.get('kind')}"
        by_kind[doc["kind"]] = doc
    return by_kind


def container(ds: JSON) -> JSON:
    only: JSON
    (only,) = ds["spec"]["template"]["spec"]["containers"]
    return only


def config_text(objects: dict[str, JSON]) -> str:
    text: str = objects["ConfigMap"]["data"]["config.conf"]
    return text


# ---------------------------------------------------------------------------------------------
# The manifests themselves


def test_every_document_parses_and_the_kinds_are_the_expected_ones() -> None:
    docs = load_documents()
    assert sorted(doc["kind"] for _, doc in docs) == sorted(EXPECTED)
    for path, doc in docs:
        api_version, name, namespace = EXPECTED[doc["kind"]]
        meta = doc["metadata"]
        assert (doc["apiVersion"], meta["name"], meta.get("namespace", "")) == (api_version, name, namespace), path
        assert meta["labels"] == {"k8s-app": "kubeproxy"}, path


def test_the_objects_refer_to_each_other(objects: dict[str, JSON]) -> None:
    ds, sa, cm = objects["DaemonSet"], objects["ServiceAccount"], objects["ConfigMap"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": objects["ClusterRole"]["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": "kube-system"}]
    # --config points into the ConfigMap's mount, at the key the ConfigMap holds.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container(ds)["volumeMounts"]}
    config_flag = next(a for a in container(ds)["command"] if a.startswith("--config="))
    folder, key = config_flag.removeprefix("--config=").rsplit("/", 1)
    assert volumes[mounts[folder]["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    assert key in cm["data"]
    # The image is the one deploy/Containerfile's comment builds, at this version.
    assert container(ds)["image"] == f"localhost/kubeproxy:{__version__}"
    assert f"-t localhost/kubeproxy:{__version__}" in (DEPLOY / "Containerfile").read_text()


def test_daemonset_is_shaped_like_upstreams(objects: dict[str, JSON]) -> None:
    ds = objects["DaemonSet"]
    spec, pod, c = ds["spec"], ds["spec"]["template"]["spec"], container(ds)
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    assert pod["hostNetwork"] is True
    assert pod["priorityClassName"] == "system-node-critical"
    assert c["securityContext"]["privileged"] is True
    # A toleration with operator Exists and no key tolerates every taint, whatever its effect.
    assert {"operator": "Exists"} in pod["tolerations"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    lock = volumes[mounts["/run/xtables.lock"]["name"]]["hostPath"]
    assert lock == {"path": "/run/xtables.lock", "type": "FileOrCreate"}
    assert not mounts["/run/xtables.lock"].get("readOnly")  # iptables takes the lock by writing it
    assert volumes[mounts["/lib/modules"]["name"]]["hostPath"]["path"] == "/lib/modules"
    assert mounts["/lib/modules"]["readOnly"] is True
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "--hostname-override=$(NODE_NAME)" in c["command"]


def test_no_probes_as_kubeadm_and_healthz_where_load_balancers_ask(objects: dict[str, JSON], tmp_path: Path) -> None:
    # kubeadm's kube-proxy DaemonSet (cmd/kubeadm/app/phases/addons/proxy/manifests.go) has none.
    assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(container(objects["DaemonSet"]))
    path = tmp_path / "config.conf"
    path.write_text(config_text(objects))
    host, port = load_config_file(path).healthz_bind_address.rsplit(":", 1)
    # hostNetwork: a load balancer asks the node's IP, so the server must listen on every address.
    assert (host, port) in (("0.0.0.0", "10256"), ("", "10256"))


def test_configmap_config_loads_with_our_loader(objects: dict[str, JSON], tmp_path: Path) -> None:
    path = tmp_path / "config.conf"
    path.write_text(config_text(objects))
    cfg = load_config_file(path)
    assert cfg.mode == "iptables"
    assert cfg.detect_local_mode == "ClusterCIDR" and cfg.cluster_cidr == ("10.244.0.0/16",)
    assert (cfg.healthz_bind_address, cfg.metrics_bind_address) == ("0.0.0.0:10256", "127.0.0.1:10249")
    assert (cfg.min_sync_period, cfg.sync_period, cfg.masquerade_bit) == (1.0, 30.0, 14)


# ---------------------------------------------------------------------------------------------
# The command


def _expand(argv: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of a container's command."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg) for arg in argv]


def test_daemonset_command_parses_with_our_cli(objects: dict[str, JSON], tmp_path: Path) -> None:
    """The DaemonSet runs the image's `kube-proxy` as kubeadm's does, and its ARGS parse as
    upstream's kube-proxy parses them (proxy/flags.py)."""
    c = container(objects["DaemonSet"])
    entrypoint = _containerfile_entrypoint()
    assert c["command"][0] == entrypoint[0] == "/usr/local/bin/kube-proxy"
    argv = _expand(c["command"][1:], {"NODE_NAME": "node-7"})
    # What kube-proxy does first: the config file (our copy of the ConfigMap's) and the flags that apply with it.
    (tmp_path / "config.conf").write_text(config_text(objects))
    args = [arg.replace("/var/lib/kube-proxy", str(tmp_path)) for arg in argv]
    resolved = resolve(parse(args))
    assert (resolved.cfg.hostname_override, resolved.cfg.mode) == ("node-7", "iptables")
    assert resolved.warnings == ()  # no flag of the DaemonSet is shadowed by the file


def test_daemonset_flags_are_listed_by_run_help(objects: dict[str, JSON]) -> None:
    exe = Path(sys.executable).with_name("kube-proxy")
    help_text = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True, timeout=60).stdout
    flags = [arg.split("=", 1)[0] for arg in container(objects["DaemonSet"])["command"] if arg.startswith("-")]
    assert flags == ["--config", "--hostname-override"]
    for flag in flags:
        assert re.search(rf"(^|[\s,]){re.escape(flag)}\b", help_text), f"{flag} is not in `kubeproxy run --help`"


def test_the_same_parse_refuses_what_run_does_not_accept() -> None:
    with pytest.raises(FlagError, match="unknown flag: --proxy-modes"):
        parse(["--proxy-modes=iptables"])
    with pytest.raises(ConfigError, match="kernelspace"):
        resolve(parse(["--proxy-mode=kernelspace"]))


# ---------------------------------------------------------------------------------------------
# RBAC: exactly what the API source asks for

Attribute = tuple[str, str, str]  # (verb, apiGroup, resource)


def rbac_attributes(method: str, url: str) -> tuple[Attribute, str] | None:
    """The RBAC verb/group/resource (and namespace) of one request, as the real authorizer sees it."""
    parts = urlsplit(url)
    segments = parts.path.strip("/").split("/")
    if segments[0] == "api" and len(segments) >= 3:
        group, rest = "", segments[2:]
    elif segments[0] == "apis" and len(segments) >= 4:
        group, rest = segments[1], segments[3:]
    else:
        return None  # discovery, /version: allowed to every authenticated user
    namespace = ""
    if rest[0] == "namespaces" and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, named = rest[0], len(rest) > 1
    query = parse_qs(parts.query)
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    if method == "GET":
        verb = "get" if named else "watch" if query.get("watch", [""])[0] in ("true", "1") else "list"
    else:
        verb = verbs[method]
    return (verb, group, resource), namespace


def granted(role: JSON) -> set[Attribute]:
    return {
        (verb, group, resource)
        for rule in role["rules"]
        for verb in rule["verbs"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def requests_of_the_api_source(server: ApiServer, node_name: str) -> list[tuple[str, str]]:
    """Run kubeproxy's ApiSource (the one `kubeproxy run` starts) until it lists and watches."""

    async def run() -> None:
        client = connect(load_config(master=server.url), trust_env=False)
        source = ApiSource(client, node_name, lambda event: None)
        task = asyncio.create_task(source.run())
        try:
            await asyncio.wait_for(source.wait_synced(), 20)
            await asyncio.to_thread(server.wait_for_watches, len(source.reflectors))
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await client.aclose()

    asyncio.run(run())
    return list(server.requests)


@pytest.mark.timeout(60)
def test_rbac_grants_exactly_what_the_api_source_requests(objects: dict[str, JSON]) -> None:
    requests: list[tuple[str, str]] = []
    for watch_list in (True, False):  # watch-lists, and the lists a server without them gets
        with ApiServer(watch_list=watch_list) as server:
            requests += requests_of_the_api_source(server, "node-1")
    needed: set[Attribute] = set()
    for method, url in requests:
        attributes = rbac_attributes(method, url)
        if attributes is not None:
            attribute, namespace = attributes
            assert namespace == "", f"{method} {url}: the source should ask cluster-wide"
            needed.add(attribute)
    assert needed == {
        ("list", "", "services"),
        ("watch", "", "services"),
        ("list", "discovery.k8s.io", "endpointslices"),
        ("watch", "discovery.k8s.io", "endpointslices"),
        ("list", "", "nodes"),
        ("watch", "", "nodes"),
        ("list", "networking.k8s.io", "servicecidrs"),
        ("watch", "networking.k8s.io", "servicecidrs"),
    }
    role = objects["ClusterRole"]
    rights = granted(role)
    assert needed <= rights
    # Beyond that only upstream's node-proxier extras: its own Node by name, and events.
    events = {(verb, group, "events") for verb in ("create", "update", "patch") for group in ("", "events.k8s.io")}
    assert rights - needed == {("get", "", "nodes"), *events}
    # Cluster-wide: bound by a ClusterRoleBinding (a RoleBinding would limit it to one namespace).
    assert objects["ClusterRoleBinding"]["kind"] == "ClusterRoleBinding"


# ---------------------------------------------------------------------------------------------
# In-cluster authentication


@pytest.mark.root
@pytest.mark.timeout(60)
def test_without_a_kubeconfig_the_source_uses_the_pods_service_account(tmp_path: Path) -> None:
    """What a pod sees: the service account files at the standard path and the two variables the
    kubelet sets. A private mount namespace puts the files there; the host's /run is untouched."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    script = tmp_path / "probe.py"
    script.write_text(
        "import json\n"
        "from kubeproxy.sources.connection import load_config\n"
        "c = load_config()\n"
        "print(json.dumps({'server': c.cluster.server, 'ca': c.cluster.certificate_auth,\n"
        "                  'token_file': c.user.token_file, 'namespace': c.namespace}))\n"
    )
    account = "/run/secrets/kubernetes.io/serviceaccount"
    setup = (
        f"mount -t tmpfs tmpfs /run && mkdir -p {account} && cd {account} && "
        "printf token-123 > token && printf kube-system > namespace && printf CA > ca.crt && "
        f"cd / && exec {shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    )
    # A developer's kubeconfig in the environment must not win over the pod's own account.
    other = tmp_path / "other-kubeconfig"
    ApiServer().write_kubeconfig(other)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "KUBECONFIG": str(other),
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", setup], capture_output=True, text=True, env=env, timeout=30)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen == {
        "server": "https://10.96.0.1:443",
        "ca": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        # The file, not just its contents: the kubelet rotates the token and the client re-reads it.
        "token_file": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "namespace": "kube-system",
    }


# ---------------------------------------------------------------------------------------------
# kubectl apply --dry-run=server against the test API server


class Kubectl:
    def __init__(self, server: ApiServer, tmp_path: Path) -> None:
        self.kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        self.cache = tmp_path / "kube-cache"
        # An empty HOME: nothing from the developer's own ~/.kube leaks into the test.
        self.env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)}

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = ["kubectl", "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache), *args]
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60)


@pytest.fixture
def deploy_server() -> Iterator[ApiServer]:
    with ApiServer(resources=DEPLOY_RESOURCES) as server:
        yield server


def stored(server: ApiServer) -> set[tuple[str, str, str]]:
    """What the server holds besides the namespaces a cluster starts with."""
    return {key for key in server.store.objects if key[0] != "namespaces"}


def writes(server: ApiServer) -> list[tuple[str, str]]:
    return [(method, url) for method, url in server.requests if method != "GET"]


@needs_kubectl
@pytest.mark.timeout(120)
def test_kubectl_server_dry_run_accepts_deploy_and_stores_nothing(deploy_server: ApiServer, tmp_path: Path) -> None:
    kubectl = Kubectl(deploy_server, tmp_path)
    version = deploy_server.resource_version
    proc = kubectl("apply", "--dry-run=server", "-f", str(DEPLOY))
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [
        "clusterrole.rbac.authorization.k8s.io/kubeproxy created (server dry run)",
        "clusterrolebinding.rbac.authorization.k8s.io/kubeproxy created (server dry run)",
        "configmap/kubeproxy created (server dry run)",
        "daemonset.apps/kubeproxy created (server dry run)",
        "serviceaccount/kubeproxy created (server dry run)",
    ]
    assert proc.stderr == ""  # no warnings: no field the schema does not know
    assert stored(deploy_server) == set() and deploy_server.resource_version == version
    posts = writes(deploy_server)
    assert len(posts) == 5
    for _, url in posts:
        query = parse_qs(urlsplit(url).query)
        assert query["dryRun"] == ["All"] and query["fieldValidation"] == ["Strict"], url


@needs_kubectl
@pytest.mark.timeout(120)
def test_kubectl_server_dry_run_of_a_change_leaves_the_stored_objects_alone(deploy_server: ApiServer, tmp_path: Path) -> None:
    kubectl = Kubectl(deploy_server, tmp_path)
    proc = kubectl("apply", "-f", str(DEPLOY))
    assert proc.returncode == 0, proc.stderr
    # Stored as written: decoding against the schema dropped nothing.
    for _, doc in load_documents():
        held = deploy_server.get(doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        assert {k: v for k, v in held.items() if k != "metadata"} == {k: v for k, v in doc.items() if k != "metadata"}
    version = deploy_server.resource_version

    changed = copy_deploy(tmp_path / "changed", lambda docs: _set_image(docs, "localhost/kubeproxy:next"))
    proc = kubectl("apply", "--dry-run=server", "-f", str(changed))
    assert proc.returncode == 0, proc.stderr
    assert "daemonset.apps/kubeproxy configured (server dry run)" in proc.stdout.splitlines()
    proc = kubectl("replace", "--dry-run=server", "-f", str(changed))  # a PUT
    assert proc.returncode == 0 and "daemonset.apps/kubeproxy replaced (server dry run)" in proc.stdout, proc.stderr
    proc = kubectl("delete", "--dry-run=server", "-f", str(DEPLOY))
    assert proc.returncode == 0 and 'daemonset.apps "kubeproxy" deleted (server dry run)' in proc.stdout, proc.stderr
    assert deploy_server.resource_version == version
    assert len(stored(deploy_server)) == len(EXPECTED)
    assert container(deploy_server.get("DaemonSet", "kube-system", "kubeproxy"))["image"] == f"localhost/kubeproxy:{__version__}"


@needs_kubectl
@pytest.mark.timeout(120)
def test_unknown_fields_follow_kubectls_validate_flag(deploy_server: ApiServer, tmp_path: Path) -> None:
    """fieldValidation as the real server honours it: Strict refuses (see BROKEN), Warn accepts with
    a warning, Ignore accepts silently; either way the field is not stored."""
    kubectl = Kubectl(deploy_server, tmp_path)
    misspelled = copy_deploy(tmp_path / "misspelled", _misspelled_field)
    proc = kubectl("apply", "--validate=warn", "--dry-run=server", "-f", str(misspelled))
    assert proc.returncode == 0, proc.stderr
    assert 'Warning: unknown field "spec.template.spec.containers[0].imagePulPolicy"' in proc.stderr
    proc = kubectl("apply", "--validate=ignore", "-f", str(misspelled))
    assert proc.returncode == 0 and "Warning" not in proc.stderr, proc.stderr
    held = container(deploy_server.get("DaemonSet", "kube-system", "kubeproxy"))
    assert "imagePulPolicy" not in held and "imagePullPolicy" not in held


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _replaced(doc: JSON, path: tuple[Any, ...], new: Any) -> JSON:
    doc = copy.deepcopy(doc)
    parent: Any = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = new
    return doc


_ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


@pytest.fixture(scope="module")
def shared_deploy_server() -> Iterator[ApiServer]:
    with ApiServer(resources=DEPLOY_RESOURCES) as server:
        yield server


@pytest.mark.timeout(300)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_damaged_daemonset_gets_a_status_not_a_crash(shared_deploy_server: ApiServer, data: st.DataObject) -> None:
    """One field of the DaemonSet replaced by arbitrary JSON: the server answers 201 or a 4xx
    Status that says what is wrong, and stores nothing (dry run)."""
    server = shared_deploy_server
    doc = next(doc for _, doc in load_documents() if doc["kind"] == "DaemonSet")
    path = data.draw(st.sampled_from([p for p in _paths(doc) if p]))
    damaged = _replaced(doc, path, data.draw(_ANY_JSON))
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(
            "POST",
            "/apis/apps/v1/namespaces/kube-system/daemonsets?dryRun=All&fieldValidation=Strict",
            body=json.dumps(damaged).encode(),
            headers={"Content-Type": "application/json"},
        )
        response = conn.getresponse()
        body = json.loads(response.read())
    finally:
        conn.close()
    assert response.status in (201, 400, 404, 422), body
    if response.status != 201:
        assert body["kind"] == "Status" and body["code"] == response.status and body["message"]
    assert stored(server) == set()


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
        ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": "1"}, False),
    ],
)
def test_the_servers_daemonset_selector_check(selector: JSON, labels: JSON, matches: bool) -> None:
    assert selector_matches(selector, labels) is matches


def copy_deploy(folder: Path, mutate: Callable[[list[JSON]], None]) -> Path:
    """deploy/ rewritten to `folder` after `mutate` changed its documents (one file, all documents)."""
    docs = copy.deepcopy([doc for _, doc in load_documents()])
    mutate(docs)
    folder.mkdir()
    (folder / "deploy.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return folder


def _kind(docs: list[JSON], kind: str) -> JSON:
    return next(doc for doc in docs if doc["kind"] == kind)


def _set_image(docs: list[JSON], image: str) -> None:
    container(_kind(docs, "DaemonSet"))["image"] = image


def _drop_selector(docs: list[JSON]) -> None:
    del _kind(docs, "DaemonSet")["spec"]["selector"]


def _mismatched_selector(docs: list[JSON]) -> None:
    _kind(docs, "DaemonSet")["spec"]["selector"]["matchLabels"] = {"k8s-app": "kube-proxy"}


def _misspelled_field(docs: list[JSON]) -> None:
    c = container(_kind(docs, "DaemonSet"))
    c["imagePulPolicy"] = c.pop("imagePullPolicy")


def _dangling_mount(docs: list[JSON]) -> None:
    pod = _kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "lib-modules"]


def _string_for_bool(docs: list[JSON]) -> None:
    _kind(docs, "DaemonSet")["spec"]["template"]["spec"]["hostNetwork"] = "yes"


def _subject_without_namespace(docs: list[JSON]) -> None:
    del _kind(docs, "ClusterRoleBinding")["subjects"][0]["namespace"]


def _rule_without_verbs(docs: list[JSON]) -> None:
    _kind(docs, "ClusterRole")["rules"][0]["verbs"] = []


def _unknown_kind(docs: list[JSON]) -> None:
    _kind(docs, "ConfigMap")["kind"] = "KubeProxyConfiguration"


def _missing_namespace(docs: list[JSON]) -> None:
    _kind(docs, "ConfigMap")["metadata"]["namespace"] = "kube-sytem"


BROKEN = {
    "no selector": (_drop_selector, 'The DaemonSet "kubeproxy" is invalid: spec.selector: Required value'),
    "selector does not match": (_mismatched_selector, "spec.template.metadata.labels: Invalid value: "),
    "misspelled field": (
        _misspelled_field,
        'strict decoding error: unknown field "spec.template.spec.containers[0].imagePulPolicy"',
    ),
    "mount of no volume": (_dangling_mount, 'spec.template.spec.containers[0].volumeMounts[2].name: Not found: "lib-modules"'),
    "wrong type": (_string_for_bool, "spec.template.spec.hostNetwork: expected boolean, got string"),
    "subject without namespace": (_subject_without_namespace, "subjects[0].namespace: Required value"),
    "rule without verbs": (_rule_without_verbs, "rules[0].verbs: Required value: verbs must contain at least one value"),
    "unknown kind": (_unknown_kind, 'no matches for kind "KubeProxyConfiguration" in version "v1"'),
    "no such namespace": (_missing_namespace, 'namespaces "kube-sytem" not found'),
}


@needs_kubectl
@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(BROKEN))
def test_kubectl_reports_a_broken_copy(case: str, deploy_server: ApiServer, tmp_path: Path) -> None:
    mutate, message = BROKEN[case]
    broken = copy_deploy(tmp_path / "broken", mutate)
    version = deploy_server.resource_version
    proc = Kubectl(deploy_server, tmp_path)("apply", "--dry-run=server", "-f", str(broken))
    assert proc.returncode == 1
    assert message in proc.stderr, proc.stderr
    assert stored(deploy_server) == set() and deploy_server.resource_version == version


# ---------------------------------------------------------------------------------------------
# Containerfile (no container runtime here: the recipe is read, not built)


def containerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions, pending = [], ""
    for line in (DEPLOY / "Containerfile").read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip().removesuffix("\\") + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            keyword, _, args = pending.strip().partition(" ")
            instructions.append((keyword.upper(), " ".join(args.split())))
            pending = ""
    assert not pending, "the Containerfile ends in a continuation line"
    return instructions


def _containerfile_entrypoint() -> list[str]:
    entrypoints = [args for keyword, args in containerfile_instructions() if keyword == "ENTRYPOINT"]
    assert len(entrypoints) == 1
    argv: list[str] = json.loads(entrypoints[0])  # exec form: a JSON array, no shell in between
    return argv


def apt_packages() -> set[str]:
    packages: set[str] = set()
    for keyword, args in containerfile_instructions():
        if keyword == "RUN":
            for command in args.split("&&"):
                words = command.split()
                if words[:2] == ["apt-get", "install"]:
                    packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages


def image_packages() -> set[str]:
    """deploy/image/packages: what deploy/image/build puts in the rootfs."""
    lines = (DEPLOY / "image" / "packages").read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def test_containerfile_base_packages_install_and_entrypoint() -> None:
    instructions = containerfile_instructions()
    (base,) = [args for keyword, args in instructions if keyword == "FROM"]
    assert re.fullmatch(r"(docker\.io/library/)?debian:bookworm(-slim)?", base), base
    # The same packages as the engine-free build, IPVS mode's ipvsadm and ipset among them.
    assert apt_packages() == image_packages() >= {"iptables", "nftables", "ipset", "ipvsadm", "conntrack", "iproute2"}
    runs = " && ".join(args for keyword, args in instructions if keyword == "RUN")
    # Dependencies only from the lock, every file's hash checked; kubeproxy itself without dependencies.
    assert re.search(r"pip install [^&]*--require-hashes [^&]*-r /tmp/image/requirements\.lock", runs)
    assert re.search(r"pip install [^&]*--no-deps [^&]*kubeproxy-\*\.whl", runs)
    assert "update-alternatives --install /usr/sbin/iptables iptables /usr/sbin/iptables-wrapper" in runs
    # Everything copied into the build exists in the repository root (the build context).
    for keyword, args in instructions:
        if keyword == "COPY":
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    # The entrypoint is upstream's command name, the console script of that name.
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert _containerfile_entrypoint() == ["/usr/local/bin/kube-proxy"] and "kube-proxy" in scripts
    assert "ln -s /opt/kubeproxy/bin/kube-proxy /usr/local/bin/kube-proxy" in runs


def test_the_image_lock_pins_every_dependency_with_hashes() -> None:
    """requirements.lock holds exactly the proxy's dependencies (no extra) at exact versions, each with hashes."""
    text = (DEPLOY / "image" / "requirements.lock").read_text()
    entries = re.findall(r"^([A-Za-z0-9_.-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", text, re.MULTILINE)
    pinned = {re.sub(r"[-_.]+", "-", name).lower() for name, _, _ in entries}
    assert len(entries) == len(re.findall(r"^\S+==", text, re.MULTILINE))  # no pin without hashes
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    direct = {re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ \[;]", dep)[0]).lower() for dep in project["dependencies"]}
    assert direct <= pinned
    lab = {re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ \[;]", dep)[0]).lower() for dep in project["optional-dependencies"]["lab"]}
    assert not lab & pinned


# The programs kubeproxy runs on a node (backends/iptables, conntrack cleanup, nfacct counters).
NODE_TOOLS = ("iptables-restore", "iptables-save", "ip6tables-restore", "ip6tables-save", "nft", "conntrack", "ip", "nfacct")


def _debian_package_of(tool: str) -> str | None:
    where = shutil.which(tool)
    if where is None:
        return None
    for candidate in (where, os.path.realpath(where), f"/sbin/{tool}", f"/bin/{tool}"):
        proc = subprocess.run(["dpkg", "-S", candidate], capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            return proc.stdout.split(":", 1)[0]
    return None


@pytest.mark.skipif(shutil.which("dpkg") is None, reason="needs a Debian host to map tools to packages")
def test_containerfile_packages_provide_the_tools_kubeproxy_runs() -> None:
    """The base image is Debian bookworm, as this host is: the host's own packages say which
    package provides each program the proxy calls."""
    packages = apt_packages()
    found = {tool: _debian_package_of(tool) for tool in NODE_TOOLS}
    missing_here = [tool for tool, package in found.items() if package is None]
    if missing_here:
        pytest.skip(f"not installed on this host, cannot tell their package: {', '.join(missing_here)}")
    assert {tool: package for tool, package in found.items() if package not in packages} == {}

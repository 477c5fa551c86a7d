"""Upstream's control plane in the lab: etcd, kube-apiserver and kube-controller-manager, the
binaries scripts/upstream builds, on loopback (or one address of a namespace the lab made).

    with ControlPlane.start(upstream_bin(), workdir) as cp:      # awaited via /readyz
        cp.kubectl("apply", "-f", "deploy/00-rbac.yaml")
        cp.api.get("/api/v1/nodes")                               # admin, through `kubectl proxy`

The API server serves TLS with a CA made here by `openssl`, signs service-account tokens with
its own key pair, authorizes with Node,RBAC and admits with its defaults plus NodeRestriction
(what kubeadm turns on). The controller manager runs only the controllers whose objects the
proxies consume: EndpointSlices (from selectors, and mirrored from Endpoints), ServiceCIDRs, and
the ServiceAccounts pods need to be admitted.

The lab's own requests go through `kubectl proxy` on a unix socket: a socket file is reachable
from every network namespace, so a test drives an API server that listens inside a namespace
without entering it. The proxies under test reach the server over TLS with their own tokens.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx2
import yaml

from kubeproxy.lab import netns as L

UPSTREAM_VERSION = "v1.37.2"
UPSTREAM_BIN_ENV = "KUBEPROXY_UPSTREAM_BIN"
UPSTREAM_CACHE_ENV = "KUBEPROXY_UPSTREAM_CACHE"
DEFAULT_CACHE = "/var/cache/kubeproxy-upstream"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-proxy", "kubectl")
CONTROLLERS = (
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "service-cidr-controller",
    "serviceaccount-controller",
)
SERVICE_CIDR = "10.96.0.0/12"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# A pod's default terminationGracePeriodSeconds (k8s.io/api v0.37.2 core/v1 types.go), what a
# kubelet gives kube-apiserver to drain its requests on SIGTERM: a loaded server takes over 10 s.
APISERVER_GRACE_SECONDS = 30.0
# One kubectl call: ends a hung call, with room for a loaded server or the VM under TCG.
KUBECTL_TIMEOUT = 180.0


class ControlPlaneError(RuntimeError):
    """A part did not start, or exited; the message names it and shows its log's tail."""


def upstream_bin() -> Path | None:
    """The folder of upstream's binaries: $KUBEPROXY_UPSTREAM_BIN, else scripts/upstream's cache
    for UPSTREAM_VERSION; None when a binary is missing there."""
    override = os.environ.get(UPSTREAM_BIN_ENV)
    folder = Path(override) if override else Path(os.environ.get(UPSTREAM_CACHE_ENV, DEFAULT_CACHE)) / UPSTREAM_VERSION / "bin"
    return folder if all(os.access(folder / name, os.X_OK) for name in BINARIES) else None


def free_port(host: str) -> int:
    """A port nobody listens on at `host` now (in this process's namespace)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _advertise_args(address: str) -> list[str]:
    """The address the `kubernetes` Service's endpoints name. The endpoint reconciler refuses a
    loopback or unspecified one, so a server on such an address leaves that Service without
    endpoints (the lab's proxies are not pods and never call it by its ClusterIP)."""
    ip = ipaddress.ip_address(address)
    if ip.is_loopback or ip.is_unspecified:
        return ["--advertise-address", address if ip.is_loopback else "127.0.0.1", "--endpoint-reconciler-type", "none"]
    return ["--advertise-address", address]


def _openssl(workdir: Path, *args: str) -> None:
    proc = subprocess.run(["openssl", *args], cwd=workdir, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


@dataclass(frozen=True)
class Pki:
    """The files of the cluster's CA, the server's certificate, client certificates and the
    service-account key pair, all under one folder."""

    folder: Path

    def path(self, name: str) -> Path:
        return self.folder / name

    @classmethod
    def make(cls, folder: Path, server_ips: Sequence[str]) -> Pki:
        folder.mkdir(parents=True, exist_ok=True)
        pki = cls(folder)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
        _openssl(folder, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                 "-subj", "/CN=kubeproxy-lab-ca")  # fmt: skip
        names = ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
                 "localhost"]  # fmt: skip
        sans = ",".join([*(f"DNS:{n}" for n in names), *(f"IP:{ip}" for ip in server_ips)])
        pki._issue("apiserver", "/CN=kube-apiserver", f"subjectAltName={sans}\nextendedKeyUsage=serverAuth")
        pki._issue("admin", "/O=system:masters/CN=kubernetes-admin", "extendedKeyUsage=clientAuth")
        pki._issue("controller-manager", "/CN=system:kube-controller-manager", "extendedKeyUsage=clientAuth")
        _openssl(folder, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key")
        _openssl(folder, "pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        return pki

    def _issue(self, name: str, subject: str, extensions: str) -> None:
        ext = self.path(f"{name}.ext")
        ext.write_text(extensions + "\n")
        _openssl(self.folder, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                 "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)  # fmt: skip
        _openssl(self.folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "2", "-extfile", ext.name, "-out", f"{name}.crt")  # fmt: skip

    def data(self, name: str) -> str:
        return base64.b64encode(self.path(name).read_bytes()).decode()


def kubeconfig(server: str, ca_data: str, user: dict[str, str], name: str = "lab") -> str:
    """A kubeconfig with one cluster, one user and one context, all called `name`."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca_data}}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        },
        sort_keys=False,
    )


@dataclass
class ControlPlane:
    """A running control plane; `start()` makes one and removes it (processes, files) at the end."""

    bin_dir: Path
    workdir: Path
    pki: Pki
    server: str  # https://address:port, as the proxies reach it
    admin_kubeconfig: Path
    api: httpx2.Client  # admin, through the kubectl proxy's unix socket
    ns: L.NetNS | None
    startup_seconds: float = 0.0
    processes: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    etcd_url: str = ""  # http://127.0.0.1:port, inside `ns`
    apiserver_args: list[str] = field(default_factory=list)  # as started; restart_apiserver() adds to them

    @classmethod
    @contextmanager
    def start(
        cls,
        bin_dir: Path,
        workdir: Path,
        *,
        ns: L.NetNS | None = None,
        address: str = "127.0.0.1",
        port: int | None = None,
        service_cidr: str = SERVICE_CIDR,
        apiserver_flags: Sequence[str] = (),
        timeout: float = 90,
    ) -> Iterator[ControlPlane]:
        """etcd, kube-apiserver at https://`address`:`port` (with `apiserver_flags` last) and
        kube-controller-manager, in `ns` (else this process's namespace), until the block ends.
        Returns once /readyz answers ok and the controller manager has made the default
        ServiceAccount."""
        began = time.monotonic()
        workdir.mkdir(parents=True, exist_ok=True)
        first_service_ip = str(ipaddress.ip_network(service_cidr.split(",")[0])[1])
        pki = Pki.make(workdir / "pki", sorted({"127.0.0.1", address, first_service_ip}))
        # A fresh namespace has every port free; in this one, ask the kernel for free ones.
        api_port = port or (6443 if ns else free_port(address))
        etcd_port, peer_port = (2379, 2380) if ns else (free_port("127.0.0.1"), free_port("127.0.0.1"))
        server = f"https://{address}:{api_port}" if ":" not in address else f"https://[{address}]:{api_port}"
        admin = workdir / "admin.kubeconfig"
        admin.write_text(kubeconfig(server, pki.data("ca.crt"),
                                    {"client-certificate-data": pki.data("admin.crt"),
                                     "client-key-data": pki.data("admin.key")}))  # fmt: skip
        cm_kubeconfig = workdir / "controller-manager.kubeconfig"
        cm_kubeconfig.write_text(kubeconfig(server, pki.data("ca.crt"),
                                            {"client-certificate-data": pki.data("controller-manager.crt"),
                                             "client-key-data": pki.data("controller-manager.key")}))  # fmt: skip
        socket_path = workdir / "api.sock"
        client = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(socket_path)), base_url="http://localhost", timeout=10)
        cp = cls(bin_dir, workdir, pki, server, admin, client, ns, etcd_url=f"http://127.0.0.1:{etcd_port}")
        with ExitStack() as stack:
            stack.callback(client.close)
            stack.callback(cp.stop)
            p = pki.path
            cp._spawn("etcd", [
                "--name", "lab", "--data-dir", str(workdir / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-cluster", f"lab=http://127.0.0.1:{peer_port}",
                "--listen-metrics-urls", "", "--log-level", "warn",
            ])  # fmt: skip
            cp.apiserver_args = [
                "--etcd-servers", cp.etcd_url,
                "--bind-address", address, "--secure-port", str(api_port),
                *_advertise_args(address),
                "--cert-dir", str(workdir / "apiserver-certs"),
                "--tls-cert-file", str(p("apiserver.crt")), "--tls-private-key-file", str(p("apiserver.key")),
                "--client-ca-file", str(p("ca.crt")),
                "--service-account-issuer", SERVICE_ACCOUNT_ISSUER,
                "--service-account-key-file", str(p("sa.pub")),
                "--service-account-signing-key-file", str(p("sa.key")),
                "--authorization-mode", "Node,RBAC",
                "--enable-admission-plugins", "NodeRestriction",
                "--service-cluster-ip-range", service_cidr,
                "--allow-privileged",
                *apiserver_flags,
            ]  # fmt: skip
            cp._spawn("kube-apiserver", cp.apiserver_args)
            cp._spawn("kubectl-proxy", ["proxy", "--kubeconfig", str(admin), "--unix-socket", str(socket_path)],
                      binary="kubectl")  # fmt: skip
            cp._await("/readyz", began + timeout)
            # Started once the server is ready: the controller manager gives a server 10 s to turn
            # healthy and then exits (WaitForAPIServer), which a slow machine (a VM under TCG) exceeds.
            cp._spawn("kube-controller-manager", [
                "--kubeconfig", str(cm_kubeconfig),
                "--controllers", ",".join(CONTROLLERS),
                "--service-account-private-key-file", str(p("sa.key")),
                "--root-ca-file", str(p("ca.crt")),
                "--service-cluster-ip-range", service_cidr,
                # Each controller acts as its own ServiceAccount under the bootstrap roles, as
                # kubeadm runs it (system:kube-controller-manager itself may not write slices).
                "--use-service-account-credentials",
                "--leader-elect=false", "--secure-port", "0",
            ])  # fmt: skip
            cp._await("/api/v1/namespaces/default/serviceaccounts/default", began + timeout)
            cp.startup_seconds = time.monotonic() - began
            yield cp

    def _spawn(self, name: str, args: list[str], *, binary: str | None = None, log_mode: str = "w") -> None:
        argv = [str(self.bin_dir / (binary or name)), *args]
        log: IO[str] = open(self.workdir / f"{name}.log", log_mode)  # noqa: SIM115 (the child writes it until stop())
        try:
            if self.ns is not None:
                child = self.ns.popen(argv, stdout=log, stderr=subprocess.STDOUT)
            else:
                child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
        finally:
            log.close()
        self.processes[name] = child

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(empty)"

    def check_alive(self) -> None:
        for name, child in self.processes.items():
            if child.poll() is not None:
                raise ControlPlaneError(f"{name} exited with status {child.returncode}:\n{self.log_tail(name)}")

    def _await(self, path: str, deadline: float) -> None:
        last = ""
        while True:
            self.check_alive()
            try:
                answer = self.api.get(path)
                if answer.status_code == 200:
                    return
                last = f"{answer.status_code} {answer.text[:300]}"
            except httpx2.TransportError as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                raise ControlPlaneError(f"GET {path} did not answer 200 in time (last: {last})")
            time.sleep(0.1)

    def stop_apiserver(self, timeout: float = APISERVER_GRACE_SECONDS) -> None:
        """Stop kube-apiserver (SIGTERM, as a node's kubelet restarts it; SIGKILL after the
        kubelet's grace period): every watch on it ends."""
        L.stop_process(self.processes["kube-apiserver"], timeout)

    def start_apiserver(self, extra_flags: Sequence[str] = (), timeout: float = 90) -> None:
        """Start kube-apiserver again with the flags it started with, `extra_flags` after them
        (a later flag wins), and wait until /readyz answers ok. Its log goes on in the same file."""
        deadline = time.monotonic() + timeout
        self._spawn("kube-apiserver", [*self.apiserver_args, *extra_flags], log_mode="a")
        self._await("/readyz", deadline)

    def restart_apiserver(self, extra_flags: Sequence[str] = (), timeout: float = 90) -> None:
        self.stop_apiserver(APISERVER_GRACE_SECONDS)
        self.start_apiserver(extra_flags, timeout)

    def etcd_revision(self) -> int:
        """etcd's current revision (the resourceVersion of the newest write)."""
        return int(self._etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "limit": 1})["header"]["revision"])

    def write_etcd(self, key: bytes, value: bytes) -> int:
        """Put `key` in etcd directly (no API server needed) and return the revision it made: a
        write that moves etcd past every version an API server has sent so far."""
        answer = self._etcd("/v3/kv/put", {"key": base64.b64encode(key).decode(), "value": base64.b64encode(value).decode()})
        return int(answer["header"]["revision"])

    def compact_etcd(self, revision: int) -> None:
        """Compact etcd's history up to `revision` through its HTTP/JSON gateway: every
        resourceVersion before it is gone (a watch or list at one answers 410 Expired)."""
        self._etcd("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    def etcd_compacted_at(self, revision: int) -> bool:
        """Whether etcd refuses a read at `revision` because its history there is compacted."""
        try:
            self._etcd("/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "limit": 1, "revision": str(revision)})
        except ControlPlaneError as e:
            if "compacted" in str(e):
                return True
            raise
        return False

    def _etcd(self, path: str, body: dict[str, object]) -> dict[str, Any]:
        """POST to etcd's gateway from inside the control plane's namespace (etcd listens there)."""
        argv = ["curl", "-sS", "--fail-with-body", "-m", "10", "-X", "POST", "--data-binary", "@-", self.etcd_url + path]
        if self.ns is not None:
            argv = self.ns.argv(argv)
        proc = subprocess.run(argv, input=json.dumps(body), capture_output=True, text=True, timeout=20, check=False)
        if proc.returncode != 0:
            raise ControlPlaneError(f"etcd {path} failed ({proc.returncode}): {proc.stdout.strip()} {proc.stderr.strip()}")
        answer: dict[str, Any] = json.loads(proc.stdout)
        return answer

    def stop(self, timeout: float = 10) -> None:
        """Stop the parts, last started first (the API server outlives its clients)."""
        for name in reversed(list(self.processes)):
            L.stop_process(self.processes.pop(name), timeout)

    def run_kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = KUBECTL_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        """Upstream's kubectl as the cluster's admin."""
        argv = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.admin_kubeconfig), *args]
        if self.ns is not None:
            argv = self.ns.argv(argv)
        try:
            proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ControlPlaneError(f"kubectl {' '.join(args)} did not finish within {timeout:g} s") from exc
        if check and proc.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def token_kubeconfig(self, path: Path, namespace: str, service_account: str, duration: str = "2h") -> Path:
        """A kubeconfig for `service_account` with a token from the TokenRequest API
        (`kubectl create token`) and the cluster's CA, as a deployed proxy has them."""
        token = self.run_kubectl("create", "token", service_account, "-n", namespace, "--duration", duration).stdout.strip()
        path.write_text(kubeconfig(self.server, self.pki.data("ca.crt"), {"token": token}))
        return path


def copy_admin_kubeconfig(cp: ControlPlane, dest: Path) -> None:
    shutil.copyfile(cp.admin_kubeconfig, dest)
    dest.chmod(0o600)

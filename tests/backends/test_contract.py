"""The backend contract (model/contract.py), asked of every registered mode alike.

Each mode's backend, made by the registry, syncs a small cluster, a change, a delete and an
empty cluster; a sync its tools refuse raises SyncError, leaves the node as it was and is counted
in the mode's failure metric; cleanup leaves the node as it was before the first sync. On
`FakeNode` for every mode; in the kernel (a namespace of the test's own) for every mode but
IPVS, whose ip_vs module the hosts lack (its kernel checks run in the VM).

What a mode programmed is read mode-blind: every registered mode's listings of the node's state.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends import registry
from kubeproxy.backends.fake_node import FakeNode
from kubeproxy.backends.userspace import factory as userspace_factory
from kubeproxy.cluster.addresses import ip_text, valid_ip
from kubeproxy.kernel.host import Capability, Host, Intercepted
from kubeproxy.lab.netns import NetNS
from kubeproxy.model.contract import Backend, SyncError
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions

Run = Callable[..., subprocess.CompletedProcess[str]]

OPTS = NodeOptions(node_name="node", node_ip="192.168.0.2", nfacct_counters=())
WEB = ServicePortName("default", "web", "http", "TCP")
DNS = ServicePortName("kube-system", "dns", "dns", "UDP")
WEB_IP, DNS_IP = "10.96.10.10", "10.96.0.10"


def _service(name: ServicePortName, ip: str, port: int, node_port: int) -> ServicePortInfo:
    return ServicePortInfo(name, valid_ip(ip), port, name.protocol, node_port=node_port)


def _view(*services: tuple[ServicePortInfo, Sequence[str]]) -> NodeView:
    return NodeView(
        {svc.name: svc for svc, _ in services},
        {svc.name: [EndpointInfo(ip_text(valid_ip(ip)), 8080) for ip in pods] for svc, pods in services},
    )


WEB_SVC = _service(WEB, WEB_IP, 80, 30080)
DNS_SVC = _service(DNS, DNS_IP, 53, 30053)


BUILTIN_CHAINS = (":PREROUTING ", ":INPUT ", ":FORWARD ", ":OUTPUT ", ":POSTROUTING ")
# iptables-nft's tables, read through iptables-save; nft lists them too, empty once made
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw", "security")


def _without_iptables_tables(lines: list[str]) -> list[str]:
    kept: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith("table "):
            skipping = line.split()[2] in IPTABLES_TABLES
        if not skipping:
            kept.append(line)
        if line == "}":
            skipping = False
    return kept


def programmed(run: Run) -> str:
    """What the node's tools list, each listing after its command: iptables-save's rules and
    chains of its own (a table the kernel made when first listed holds neither)."""
    out: list[str] = []
    # every mode's listings: a mode's sync or cleanup must leave the others' state alone too
    for argv in dict.fromkeys(argv for m in registry.MODES.values() for argv in m.listings):
        try:
            proc = run(list(argv), check=False)
        except OSError:  # the tool is not installed here
            continue
        lines = _without_iptables_tables(proc.stdout.splitlines())
        kept = [line for line in lines if not line.startswith(("#", "*", "COMMIT", *BUILTIN_CHAINS))]
        out += [" ".join(argv), *(line.split(" [", 1)[0] if line.startswith(":") else line for line in kept)]
    return "\n".join(out)


@dataclass
class Refusing:
    """Refuses the mode's kernel-programming tools (its `tools`) while `refuse` is set."""

    tools: tuple[str, ...]
    refuse: bool = False

    def __call__(self, proceed: Run, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        if self.refuse and argv[0] in self.tools:
            if kw.get("check", True):
                raise SyncError(f"{argv[0]}: refused by the test")
            return subprocess.CompletedProcess(list(argv), 1, "", "refused by the test")
        return proceed(argv, **kw)


@pytest.fixture(autouse=True)
def _userspace_state_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the userspace mode writes a state file for its restarts; the node's is not the test's to write
    monkeypatch.setattr(userspace_factory, "state_path", lambda: tmp_path / "userspace-state.json")


def _backend(mode: str, run: Run) -> Iterator[Backend]:
    backend = registry.create(mode, run=run, sync_period=30.0)
    try:
        yield backend
    finally:
        server = getattr(backend, "server", None)  # the userspace relay's thread
        if server is not None:
            server.stop()


def contract(mode: str, host: Host) -> None:
    """The contract, on `host`. The refusal goes into its runs: not into in-process libnftables."""
    refusing = Refusing(registry.mode(mode).tools(""))
    node = Intercepted(host, refusing, without=frozenset({Capability.ENTER}))
    before = programmed(host)
    for backend in _backend(mode, node):
        backend.prepare()
        assert backend.check(_view((WEB_SVC, ["10.244.1.10"])), OPTS) is None

        backend.sync(_view((WEB_SVC, ["10.244.1.10"])), OPTS, None)
        one = programmed(host)
        assert WEB_IP in one and DNS_IP not in one

        backend.sync(_view((WEB_SVC, ["10.244.1.10"]), (DNS_SVC, ["10.244.2.20"])), OPTS, frozenset({("kube-system", "dns")}))
        two = programmed(host)
        assert WEB_IP in two and DNS_IP in two

        refusing.refuse = True
        with pytest.raises(SyncError) as refused:
            backend.sync(_view((DNS_SVC, ["10.244.2.20"])), OPTS, None)
        refusing.refuse = False
        assert programmed(host) == two  # a refused sync changes nothing
        metrics = registry.proxy_metrics(mode)
        backend.record_failure(metrics.for_family("IPv4"), refused.value, False)
        assert metrics.registry.get_sample_value(registry.mode(mode).failure_metric, {"ip_family": "IPv4"}) == 1

        backend.sync(_view((DNS_SVC, ["10.244.2.20"])), OPTS, None)  # the delete, after the refusal
        deleted = programmed(host)
        assert DNS_IP in deleted and WEB_IP not in deleted

        assert backend.sync(_view(), OPTS, None).full
        empty = programmed(host)
        assert WEB_IP not in empty and DNS_IP not in empty

        backend.cleanup()
        assert programmed(host) == before


@pytest.mark.parametrize("mode", list(registry.MODES))
def test_every_mode_keeps_the_contract_on_the_fake_node(mode: str) -> None:
    contract(mode, FakeNode())


def _kernel_has(mode: str, ns: NetNS) -> str | None:
    """Why this host's kernel cannot run `mode`, or None."""
    missing = [tool for tool in registry.mode(mode).tools("") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed"
    if "ipvsadm" in registry.mode(mode).tools("") and ns.run(["ipvsadm", "-Ln"], check=False).returncode != 0:
        return "the kernel has no IPVS (ip_vs)"
    return None


# IPVS needs the ip_vs module, which the hosts the suite runs on lack (CI included); its kernel
# behaviour is checked in the VM on Debian's kernel (tests/vm/test_ipvs_vm.py). A mode left out
# here is named, not skipped: a skipped kernel test would hide a missing tool on a CI host.
HOST_KERNEL_MODES = [mode for mode in registry.MODES if mode != "ipvs"]


@pytest.mark.root
@pytest.mark.parametrize("mode", HOST_KERNEL_MODES)
def test_every_mode_keeps_the_contract_in_the_kernel(mode: str, netns: NetNS) -> None:
    assert (why := _kernel_has(mode, netns)) is None, f"{mode} mode: {why}"
    contract(mode, netns)

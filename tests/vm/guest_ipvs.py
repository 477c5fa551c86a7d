"""Runs inside the VM, in the `node` namespace: two syncs of IpvsProxier against a real IPVS kernel.

Writes what it saw to ipvs_sync.json in the working directory (the VM's shared results folder).
Kept small on purpose: Python is ~40x slower under TCG.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from kubeproxy.backends.ipvs.apply import parse_ipvsadm_save
from kubeproxy.backends.ipvs.proxier import IpvsProxier
from kubeproxy.backends.ipvs.render import ipvsadm_save_text
from kubeproxy.cluster.addresses import AddressText, valid_ip
from kubeproxy.kernel.exec import local_run
from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import NodeOptions
from tests.vm.guest_ipvs_trace import trace_check

ECHO = ServicePortName("default", "echo", "tcp", "TCP")
ECHO_SVC = ServicePortInfo(ECHO, valid_ip("10.96.20.20"), 90, "TCP")
PODS = {"pod": "10.244.1.10", "pod2": "10.244.2.10"}


def _ask(conn: socket.socket) -> str:
    conn.sendall(b"who\n")
    return conn.recv(100).decode().strip()


def graceful_termination(proxier: IpvsProxier, opts: NodeOptions, web: dict[str, Any]) -> dict[str, Any]:
    """A long-lived connection to a removed endpoint keeps working; new ones go to the other pod."""
    servers = []
    for pod, ip in PODS.items():
        proc = subprocess.Popen(["ip", "netns", "exec", pod, sys.executable, str(Path(__file__).with_name("guest_echo.py")),
                                 pod, ip, "9090"], stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"  # the server says so
        servers.append(proc)
    both = [EndpointInfo(AddressText(ip), 9090) for ip in PODS.values()]
    proxier.sync(NodeView({**web["services"], ECHO: ECHO_SVC}, {**web["endpoints"], ECHO: both}), opts, None)
    # While both pods serve: where does the tracer say the node's packet goes, and does the kernel agree?
    traced = trace_check("10.96.20.20:90", {name: ip for name, ip in PODS.items()})
    long_lived = socket.create_connection(("10.96.20.20", 90), timeout=10)
    first = _ask(long_lived)
    kept = [e for e in both if e.ip != PODS[first]]
    removal = proxier.sync(NodeView({**web["services"], ECHO: ECHO_SVC}, {**web["endpoints"], ECHO: kept}), opts, None)
    saved = local_run(["ipvsadm-save", "-n"]).stdout
    listed = local_run(["ipvsadm", "-Ln"]).stdout
    try:
        still = _ask(long_lived)
    except OSError as exc:
        still = f"error: {exc}"
    fresh = []
    for _ in range(4):
        try:
            with socket.create_connection(("10.96.20.20", 90), timeout=10) as c:
                fresh.append(_ask(c))
        except OSError as exc:
            fresh.append(f"error: {exc}")
    direct = {}
    for pod, ip in PODS.items():
        try:
            with socket.create_connection((ip, 9090), timeout=10) as c:
                direct[pod] = _ask(c)
        except OSError as exc:
            direct[pod] = f"error: {exc}"
    conns = local_run(["ipvsadm", "-Lnc"]).stdout
    long_lived.close()
    for proc in servers:
        proc.kill()
    return {"trace": traced, "first": first, "still": still, "fresh": fresh, "removal_ops": list(removal.ipvs_ops.lines),
            "saved_after_removal": saved, "listed_after_removal": listed,
            "direct": direct, "conns": conns}


def main() -> int:
    name = ServicePortName("default", "web", "http", "TCP")
    svc = ServicePortInfo(name, valid_ip("10.96.10.10"), 80, "TCP", node_port=30080)
    view = NodeView({name: svc}, {name: [EndpointInfo(AddressText("10.244.1.10"), 8080, is_local=True)]})
    opts = NodeOptions(node_name="node", node_ip="192.168.0.2")
    proxier = IpvsProxier()
    proxier.prepare()
    first = proxier.sync(view, opts, None)
    second = proxier.sync(view, opts, None)
    kernel = parse_ipvsadm_save(local_run(["ipvsadm-save", "-n"]).stdout)
    out = {
        "first_ipvs_lines": list(first.ipvs_ops.lines),
        "first_ipset_lines": first.ipset_lines,
        "first_addresses": first.addresses_changed,
        "second_ipvs_lines": list(second.ipvs_ops.lines),
        "second_ipset_lines": second.ipset_lines,
        "second_addresses": second.addresses_changed,
        "second_iptables_loaded": second.iptables_loaded,
        "rendered_ipvs": ipvsadm_save_text(first.rendered.services),
        "kernel_ipvs": ipvsadm_save_text({vs: tuple(rs) for vs, rs in kernel.items()}),
        "ops": proxier.applier.ops,
        "check": proxier.check(view, opts),
    }
    out["graceful"] = graceful_termination(proxier, opts, {"services": dict(view.services), "endpoints": dict(view.endpoints)})
    with open("ipvs_sync.json", "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

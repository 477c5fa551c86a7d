"""IPVS dual-stack on a real IPVS kernel (the VM guest, as root): both families' lanes side by side.

The host kernel has no IPVS, so tests/proxy/test_dualstack.py proves the dual-stack IPVS lanes on
the fake node only. This script asks the real kernel the same questions. In the guest of
kubeproxy/lab/vm.py, from the repository root:

    python -m tests.vm.guest_ipvs_dualstack

It makes two namespaces (`ds-node`, `ds-pod`, a veth pair with an IPv4 and an IPv6 address each),
an echo pod answering "pod" on both families, then, inside `ds-node`, one IpvsProxier per family
(what the live loop's two lanes hold) synced to a dual-stack ClusterIP service. It checks:
- the sets: KUBE-CLUSTER-IP (family inet) and KUBE-6-CLUSTER-IP (family inet6), each with its
  family's entry; ip6tables rules match KUBE-6-CLUSTER-IP;
- the IPVS table holds both virtual servers, kube-ipvs0 both addresses;
- connections to 10.96.30.30:80 and [fd00:96::30]:80 from the node reach the pod;
- the IPv4 lane syncing an empty view leaves the IPv6 virtual server, address and sets alone
  (and the IPv6 VIP still answers); then both lanes clean up.
Prints a JSON report; exit status 0 when every check passed, 1 otherwise. Namespaces are
removed at the end whatever happened. Through the harness, as tests/vm/test_ipvs_vm.py boots
guest_ipvs.sh (no edit of vm.py needed; `files` lands in the guest's working directory):

    from kubeproxy.lab import vm
    script = 'RES=$(pwd); REPO=$(cat repo_path); cd "$REPO" && ' \
             '"$REPO/.venv/bin/python" -m tests.vm.guest_ipvs_dualstack > "$RES/ipvs_dualstack.json"'
    result = vm.VM(vm.build()).run(script, files={"repo_path": "/work/main"}, timeout=900)

The exit status is the script's (0: every check passed); the report is ipvs_dualstack.json.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from typing import Any

NODE_NS, POD_NS = "ds-node", "ds-pod"
VIP4, VIP6 = "10.96.30.30", "fd00:96::30"
POD4, POD6 = "10.244.1.10", "fd00:10:244:1::10"
ECHO = (
    "import socket\n"
    "s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)\n"
    "s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('::', 8080)); s.listen(64); print('ready', flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(b'pod\\n'); c.close()\n"
)


def sh(*argv: str, ns: str | None = None, check: bool = True) -> str:
    full = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    return subprocess.run(full, capture_output=True, text=True, check=check).stdout


def setup() -> None:
    sh("ip", "netns", "add", NODE_NS)
    sh("ip", "netns", "add", POD_NS)
    sh("ip", "link", "add", "ds-veth0", "netns", NODE_NS, "type", "veth", "peer", "name", "eth0", "netns", POD_NS)
    for ns in (NODE_NS, POD_NS):
        sh("ip", "link", "set", "lo", "up", ns=ns)
        sh("sysctl", "-q", "-w", "net.ipv6.conf.all.forwarding=1", ns=ns)
    # nodad: the addresses are usable at once, no sleep waiting for duplicate address detection.
    sh("ip", "addr", "add", "10.244.1.1/24", "dev", "ds-veth0", ns=NODE_NS)
    sh("ip", "addr", "add", "fd00:10:244:1::1/64", "dev", "ds-veth0", "nodad", ns=NODE_NS)
    sh("ip", "link", "set", "ds-veth0", "up", ns=NODE_NS)
    sh("ip", "addr", "add", f"{POD4}/24", "dev", "eth0", ns=POD_NS)
    sh("ip", "addr", "add", f"{POD6}/64", "dev", "eth0", "nodad", ns=POD_NS)
    sh("ip", "link", "set", "eth0", "up", ns=POD_NS)
    sh("ip", "route", "add", "default", "via", "10.244.1.1", ns=POD_NS)
    sh("ip", "-6", "route", "add", "default", "via", "fd00:10:244:1::1", ns=POD_NS)


def teardown() -> None:
    for ns in (NODE_NS, POD_NS):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def ask(host: str, port: int) -> str:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect((host, port))
            return s.recv(100).decode().strip()
    except OSError as exc:
        return f"error: {exc}"


def inside() -> dict[str, object]:
    """In NODE_NS: the two lanes, what the kernel holds, what the VIPs answer."""
    from kubeproxy.backends.ipvs.proxier import IpvsProxier
    from kubeproxy.cluster.addresses import AddressText, valid_ip
    from kubeproxy.model.node_model import EndpointInfo, NodeView, ServicePortInfo, ServicePortName
    from kubeproxy.model.options import Family, NodeOptions

    name = ServicePortName("default", "web", "http", "TCP")
    views = {
        Family.IPV4: NodeView({name: ServicePortInfo(name, valid_ip(VIP4), 80, "TCP")},
                              {name: [EndpointInfo(AddressText(POD4), 8080)]}),
        Family.IPV6: NodeView({name: ServicePortInfo(name, valid_ip(VIP6), 80, "TCP")},
                              {name: [EndpointInfo(AddressText(POD6), 8080)]}),
    }
    opts = {f: NodeOptions(node_name="node", family=f, node_ip="10.244.1.1" if not f.ipv6 else "fd00:10:244:1::1")
            for f in Family}
    lanes = {f: IpvsProxier(family=f) for f in Family}
    report: dict[str, object] = {}
    try:
        _checks(lanes, views, opts, report)
    except Exception as exc:  # reported, never a traceback: the caller reads JSON
        report["error"] = repr(exc)
    finally:
        for f in (Family.IPV6, Family.IPV4):
            lanes[f].cleanup()
    report["clean"] = "KUBE-" not in sh("ipset", "list", "-n") and not sh("ipvsadm-save", "-n", check=False).strip()
    return report


def _checks(lanes: dict[Any, Any], views: dict[Any, Any], opts: dict[Any, Any], report: dict[str, object]) -> None:
    from kubeproxy.model.node_model import NodeView
    from kubeproxy.model.options import Family

    lanes[Family.IPV4].prepare()
    for f in Family:
        lanes[f].sync(views[f], opts[f], None)
    saved_sets = sh("ipset", "save")
    report["set_v4"] = (f"add KUBE-CLUSTER-IP {VIP4},tcp:80" in saved_sets
                        and "create KUBE-CLUSTER-IP hash:ip,port family inet " in saved_sets)
    report["set_v6"] = (f"add KUBE-6-CLUSTER-IP {VIP6},tcp:80" in saved_sets
                        and "create KUBE-6-CLUSTER-IP hash:ip,port family inet6" in saved_sets)
    report["ip6tables_match"] = "--match-set KUBE-6-CLUSTER-IP dst,dst" in sh("ip6tables-save", "-t", "nat")
    table = sh("ipvsadm-save", "-n")
    report["ipvs_both"] = f"-A -t {VIP4}:80" in table and f"-A -t [{VIP6}]:80" in table
    dummy = sh("ip", "-o", "addr", "show", "dev", "kube-ipvs0")
    report["dummy_both"] = f"inet {VIP4}/32" in dummy and f"inet6 {VIP6}/128" in dummy
    report["answer_v4"], report["answer_v6"] = ask(VIP4, 80), ask(VIP6, 80)
    # The IPv4 lane with nothing to serve: the IPv6 half must stay whole.
    lanes[Family.IPV4].sync(NodeView({}, {}), opts[Family.IPV4], None)
    table = sh("ipvsadm-save", "-n")
    report["v4_gone_v6_kept"] = f"-A -t {VIP4}:80" not in table and f"-A -t [{VIP6}]:80" in table
    report["dummy_v6_kept"] = f"inet6 {VIP6}/128" in sh("ip", "-o", "addr", "show", "dev", "kube-ipvs0")
    report["set_v6_kept"] = f"add KUBE-6-CLUSTER-IP {VIP6},tcp:80" in sh("ipset", "save")
    report["answer_v6_after"] = ask(VIP6, 80)


def main() -> int:
    if sys.argv[1:] == ["--inside"]:
        print(json.dumps(inside()))
        return 0
    teardown()
    echo = None
    try:
        setup()
        echo = subprocess.Popen(["ip", "netns", "exec", POD_NS, sys.executable, "-c", ECHO], stdout=subprocess.PIPE, text=True)
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"  # listening: no sleep needed
        started = time.monotonic()
        proc = subprocess.run(["ip", "netns", "exec", NODE_NS, sys.executable, "-m", "tests.vm.guest_ipvs_dualstack",
                               "--inside"], capture_output=True, text=True, check=False, timeout=300)
        report = json.loads(proc.stdout) if proc.stdout.strip() else {"error": proc.stderr.strip()[-2000:]}
        report["seconds"] = round(time.monotonic() - started, 1)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, AssertionError, json.JSONDecodeError) as exc:
        report = {"error": repr(exc)}
    finally:
        if echo is not None:
            echo.kill()
            echo.wait()
        teardown()
    checks = {k: v for k, v in report.items() if isinstance(v, bool)}
    answers = {k: v for k, v in report.items() if k.startswith("answer")}
    report["ok"] = ("error" not in report and len(checks) >= 9 and all(checks.values())
                    and len(answers) == 3 and all(v == "pod" for v in answers.values()))
    print(json.dumps(report, indent=1))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The live e2e scenarios (tests/e2e/scenarios.py) inside the VM, in each mode KUBEPROXY_VM_MODES names.

Run by tests/vm/test_e2e_vm.py in one boot (`pytest tests/vm/guest_e2e.py --junitxml=...`); its
name has no `test_` prefix so the host never collects it (the host's kernel has no IPVS).

Python is ~40x slower under TCG, and starting the proxy and a bed's pods is the slow part, so
each mode gets one bed and one `kubeproxy run` for all its scenarios (tests/e2e builds both per
test): before each scenario the bed is brought back to pods a, b, c and r (scenarios remove and
add pods), and each scenario's `load` replaces the whole published set of objects, as there.
The waits are given minutes, not seconds: a sync takes seconds under TCG.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeproxy.lab.builders import JSON, Port, endpoint_slice, expected_endpoints, service
from kubeproxy.lab.cluster import REMOTE_NODE_NAME, MiniCluster, Pod

# The scenarios' asserts say what they got (pytest rewrites only test modules by itself).
pytest.register_assert_rewrite("tests.e2e.scenarios", "tests.vm.guest_hostile")
from tests.e2e import scenarios  # noqa: E402
from tests.vm import guest_hostile  # noqa: E402

MODES = tuple(m for m in os.environ.get("KUBEPROXY_VM_MODES", "ipvs").split(",") if m)
RESULTS = os.environ.get("KUBEPROXY_VM_RESULTS", "")
LOCAL_PODS = ("a", "b", "c")
REMOTE_PODS = ("r",)
SLOW = 180.0  # seconds: the proxy's start-up (imports) and a sync, under TCG
HERE = Path(__file__).parent

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", params=MODES)
def bed(request: pytest.FixtureRequest) -> Iterator[MiniCluster]:
    mode = str(request.param)
    with MiniCluster.build(pods=LOCAL_PODS, remote_pods=REMOTE_PODS, proxy_mode=mode, start_timeout=SLOW) as c:
        try:
            yield c
        finally:
            if RESULTS:  # the proxy's log, for whoever reads a failure
                Path(RESULTS, f"proxy-{mode}.log").write_text(c.proxy_log())


@pytest.fixture(scope="module")
def published(bed: MiniCluster) -> list[JSON]:
    """The objects the last scenario of the bed's mode published."""
    return []


@pytest.fixture
def cluster(bed: MiniCluster, published: list[JSON]) -> MiniCluster:
    """The mode's bed as tests/e2e/conftest.py builds it: no service, pods a, b, c (local) and r (remote).

    The last scenario's services are withdrawn first and the rules waited for until nothing of
    them is left, then the node's conntrack table flushed: a scenario's wait then sees its own
    rules appear, not the last one's (two scenarios may give one service a different policy with
    the same endpoints, which `wait_applied` alone could not tell apart).
    """
    if bed.proxy is not None and published:
        ports = list(expected_endpoints(published))  # ns/name:port of every service port published
        bed.write_manifests([bed.node_object()])
        bed.wait_rules("the last scenario's services gone",
                       lambda rules: not any(rules.endpoints(p) or rules.rejects(p) for p in ports), timeout=SLOW)
        bed.node.run(["conntrack", "-F"], check=False)
    published.clear()
    for name in [n for n in bed.pods if n not in LOCAL_PODS + REMOTE_PODS]:
        bed.remove_pod(name)
    for name in LOCAL_PODS:
        if name not in bed.pods:
            bed.add_pod(name)
    for name in REMOTE_PODS:
        if name not in bed.pods:
            bed.add_pod(name, node_name=REMOTE_NODE_NAME)
    return bed


@pytest.fixture
def load(cluster: MiniCluster, published: list[JSON]) -> scenarios.Load:
    """scenarios.live_load, with waits sized for TCG; the proxy starts on the mode's first load."""

    def load(objs: list[JSON]) -> None:
        published[:] = objs
        cluster.write_manifests([cluster.node_object(), *objs])
        if cluster.proxy is None:
            cluster.start_proxy(*scenarios.PROXY_ARGS)
            cluster.wait_synced(timeout=SLOW)
        cluster.wait_applied(objs, timeout=SLOW)

    return load


ECHO = Port("echo", 90, 9090)
ECHO_IP = "10.96.0.70"
# A client in a pod that keeps one TCP connection open: "ask" asks on it, "new" asks on a fresh
# connection, "close" closes it. Each line it prints is the name of the pod that answered.
_CLIENT = """
import socket, sys
dst = (sys.argv[1], int(sys.argv[2]))
def ask(conn):
    conn.sendall(b"?\\n")
    return conn.makefile().readline().strip()
long = socket.create_connection(dst, timeout=30)
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "ask":
        print(ask(long), flush=True)
    elif cmd == "new":
        with socket.create_connection(dst, timeout=30) as fresh:
            print(ask(fresh), flush=True)
    elif cmd == "close":
        long.close()
        print("closed", flush=True)
"""


def _echo_server(pod: Pod) -> None:
    child = pod.ns.popen([sys.executable, str(HERE / "guest_echo.py"), pod.name, pod.ip, str(ECHO.target)],
                         stdout=subprocess.PIPE)
    _await_line(child, "ready")


def _await_line(child: subprocess.Popen[str], want: str) -> None:
    """The child's next line is `want`, within SLOW seconds (a child that hangs fails the test, not the batch)."""
    assert child.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(child.stdout, selectors.EVENT_READ)
        line = child.stdout.readline() if sel.select(SLOW) else "(nothing)"
    assert line.strip() == want, f"{child.args!r}: said {line.strip()!r}, not {want!r}"


def graceful_termination(c: MiniCluster, load: scenarios.Load) -> None:
    """A long-lived TCP connection to a removed endpoint keeps working until it closes; new ones go elsewhere."""
    for name in ("a", "b"):
        _echo_server(c.pods[name])

    def echo(*pods: str) -> list[JSON]:
        return [service("echo", ECHO_IP, [ECHO]), endpoint_slice("echo", c.backends(*pods), [ECHO])]

    load(echo("a", "b"))
    client = c.pods["c"].ns.popen([sys.executable, "-c", _CLIENT, ECHO_IP, str(ECHO.port)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    _await_line(client, "ready")

    def say(cmd: str) -> str:
        assert client.stdin is not None and client.stdout is not None
        client.stdin.write(cmd + "\n")
        client.stdin.flush()
        return client.stdout.readline().strip()

    try:
        first = say("ask")
        assert first in ("a", "b"), first
        other = "b" if first == "a" else "a"
        load(echo(other))
        if c.proxy_mode == "ipvs":
            # quiesced, not deleted: weight 0 while the connection lives (upstream's graceful termination)
            assert f"-r {c.pods[first].ip}:{ECHO.target} -m -w 0" in c.node_rules().text, c.node_rules().text
        assert say("ask") == first  # the open connection still reaches the removed endpoint
        assert [say("new") for _ in range(4)] == [other] * 4  # no new connection goes to it
        assert say("ask") == first
        assert say("close") == "closed"
    finally:
        client.kill()
        client.wait(10)


SCENARIOS = [*scenarios.LIVE, graceful_termination]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_scenario(cluster: MiniCluster, load: scenarios.Load, scenario: scenarios.Scenario) -> None:
    scenario(cluster, load)


def test_hostile_addresses(bed: MiniCluster, request: pytest.FixtureRequest) -> None:
    """guest_hostile.py in the ipvs bed; the other modes have it on the host's kernel (tests/e2e)."""
    if bed.proxy_mode != "ipvs":  # before the cluster fixture: a skipped mode costs no bed reset
        pytest.skip("tests/e2e/test_hostile_addresses_kernel.py covers this mode on the host's kernel")
    cluster = request.getfixturevalue("cluster")
    guest_hostile.hostile_addresses(cluster, request.getfixturevalue("load"), SLOW)

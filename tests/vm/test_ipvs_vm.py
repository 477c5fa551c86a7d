"""IPVS mode on a kernel that has IPVS: Debian's, booted once under qemu (kubeproxy/lab/vm.py).

One boot runs guest_ipvs.sh: IpvsProxier programs a `node` namespace; a TCP connection goes
through a ClusterIP (from the node) and a NodePort (from a client namespace) to a pod; a second
sync without change must send nothing; `ipvsadm-save -n` must match the rendering.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeproxy.backends.ipvs.apply import parse_ipset_save, parse_ipvsadm_save
from kubeproxy.backends.ipvs.render import ipset_restore_text, ipvsadm_save_text
from kubeproxy.cli import main
from kubeproxy.lab import vm
from tests.backends.ipvs.test_upstream_golden import CASES, FIXTURES, render_case

HERE = Path(__file__).parent
REPO = HERE.parents[1]

# The first test waits for the boot (guest timeout 900 s below), beyond pytest-timeout's 300 s default.
pytestmark = [pytest.mark.root, pytest.mark.timeout(1020)]


HEADERS = ("# ipset restore -exist\n", "# iptables-restore --noflush\n", "# ipvsadm-restore (ipvsadm-save -n)\n",
           "# ip addr add")


def demo_parts() -> dict[str, str]:
    """`kubeproxy render --proxy-mode ipvs` of the demo, cut into the three files a person would load."""
    result = CliRunner().invoke(main, ["render", "--manifests", str(REPO / "kubeproxy/examples/demo.yaml"),
                                       "--proxy-mode", "ipvs"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    cuts = [text.index(h) for h in HEADERS]
    parts = [text[cuts[i] + len(HEADERS[i]):cuts[i + 1]] for i in range(3)]
    return dict(zip(("demo.ipset", "demo.iptables", "demo.ipvs"), parts, strict=True))


def golden_parts() -> dict[str, str]:
    """Every upstream IPVS scenario's rendering (tests/backends/ipvs/fixtures), as files for the
    guest to load into a fresh namespace each: golden-<case>.{family,ipset,iptables,ipvs}."""
    files: dict[str, str] = {}
    for name in CASES:
        _, rendered, opts = render_case(FIXTURES / name)
        files[f"golden-{name}.family"] = opts.family.value
        files[f"golden-{name}.ipset"] = ipset_restore_text(rendered, opts)
        files[f"golden-{name}.iptables"] = rendered.iptables
        files[f"golden-{name}.ipvs"] = ipvsadm_save_text(rendered.services)
    return files


@pytest.fixture(scope="module")
def demo() -> dict[str, str]:
    return demo_parts()


@pytest.fixture(scope="module")
def golden() -> dict[str, str]:
    return golden_parts()


@pytest.fixture(scope="module")
def guest(demo: dict[str, str], golden: dict[str, str]) -> vm.VMResult:
    image = vm.build()
    result = vm.VM(image).run((HERE / "guest_ipvs.sh").read_text(), files={"repo_path": str(REPO), **demo, **golden},
                              timeout=900)
    print(f"vm: boot {result.boot_seconds:.1f} s, total {result.total_seconds:.1f} s")
    print(result.output)
    print(result.files.get("ipvs_sync.json", ""))
    assert result.returncode == 0, result.output
    return result


def test_traffic_through_clusterip_and_nodeport(guest: vm.VMResult) -> None:
    assert guest.files["clusterip.out"] == "pod-says-hello\n"
    assert guest.files["nodeport.out"] == "pod-says-hello\n"


def test_kernel_matches_render_and_resync_sends_nothing(guest: vm.VMResult) -> None:
    sync = json.loads(guest.files["ipvs_sync.json"])
    assert sync["kernel_ipvs"] == sync["rendered_ipvs"]
    assert "-A -t 10.96.10.10:80 -s rr" in sync["rendered_ipvs"]
    assert "-a -t 192.168.0.2:30080 -r 10.244.1.10:8080 -m -w 1" in sync["rendered_ipvs"]
    assert sync["first_ipvs_lines"] and sync["first_ipset_lines"] > 0
    assert sync["second_ipvs_lines"] == []
    assert sync["second_ipset_lines"] == 0
    assert sync["second_addresses"] == 0
    assert sync["second_iptables_loaded"] is False
    assert sync["check"] is None


def test_kernel_holds_upstream_sets_and_chains(guest: vm.VMResult) -> None:
    names = set(guest.files["ipset_names.out"].split())
    assert {"KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP", "KUBE-LOOP-BACK", "KUBE-IPVS-IPS"} <= names
    saved = guest.files["iptables_save.out"]
    assert "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES" in saved
    assert "--match-set KUBE-CLUSTER-IP" in saved
    assert "10.96.10.10:80 rr" in guest.files["ipvsadm_ln.out"]


def test_graceful_termination_keeps_the_old_connection_and_sends_new_ones_elsewhere(guest: vm.VMResult) -> None:
    g = json.loads(guest.files["ipvs_sync.json"])["graceful"]
    other = ({"pod", "pod2"} - {g["first"]}).pop()
    assert g["still"] == g["first"]  # the removed pod still answers on the open connection
    assert g["fresh"] == [other] * 4  # weight 0: no new connection goes to it
    ip = {"pod": "10.244.1.10", "pod2": "10.244.2.10"}[g["first"]]
    assert g["removal_ops"] == [f"-e -t 10.96.20.20:90 -r {ip}:9090 -m -w 0"]
    assert f"-a -t 10.96.20.20:90 -r {ip}:9090 -m -w 0" in g["saved_after_removal"]


def test_kernel_loads_the_rendered_demo_as_is(guest: vm.VMResult, demo: dict[str, str]) -> None:
    assert parse_ipvsadm_save(guest.files["demo_kernel.ipvs"]) == parse_ipvsadm_save(demo["demo.ipvs"])
    kernel_sets = parse_ipset_save(guest.files["demo_kernel.ipset"])
    rendered_sets = parse_ipset_save(demo["demo.ipset"])
    assert rendered_sets and all(kernel_sets[name] == entries for name, entries in rendered_sets.items())


def test_the_tracer_agrees_with_the_kernel_on_an_ipvs_node(guest: vm.VMResult) -> None:
    report = json.loads(guest.files["ipvs_sync.json"])["graceful"]["trace"]
    assert report["ok"], report
    assert report["traced"] == report["ipvs_table"] == sorted(["10.244.1.10", "10.244.2.10"])


def test_dual_stack_lanes_share_the_kernel_each_touching_its_own(guest: vm.VMResult) -> None:
    report = json.loads(guest.files["ipvs_dualstack.json"])
    assert report["ok"], report


def test_kernel_loads_every_upstream_scenarios_rendering(guest: vm.VMResult, golden: dict[str, str]) -> None:
    """Each of the 59 golden scenarios' sets, rules and IPVS table loads as is, and the kernel's
    table reads back as rendered."""
    cases = sorted(k[len("golden-"):-len(".ipvs")] for k in golden if k.endswith(".ipvs"))
    assert len(cases) == len(CASES)
    failed = {c: guest.files.get(f"golden-{c}.result", "no result") for c in cases
              if guest.files.get(f"golden-{c}.result", "").strip() != "ok"}
    assert not failed, failed
    for c in cases:
        kernel = parse_ipvsadm_save(guest.files[f"golden-{c}.kernel-ipvs"])
        assert kernel == parse_ipvsadm_save(golden[f"golden-{c}.ipvs"]), c

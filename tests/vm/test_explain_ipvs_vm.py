"""`kubeproxy explain --live` on a kernel that holds an IPVS render (Debian's, under qemu:
kubeproxy/lab/vm.py; the host's kernel has no ip_vs).

The explain world (tests/explain) rendered in IPVS mode is loaded into a namespace of the guest as
the proxy leaves a node (its ipsets, its iptables rules with the jumps into them, its virtual
servers, kube-ipvs0's addresses); the kernel's `ipvsadm-save -n` must read back as rendered, and
`explain --live` of every Service must give what the render's explanation gives: the same
endpoints and shares per address, and the same rules and virtual servers in the same order;
`doctor --live` the findings the render's dumps give offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kubeproxy.backends.ipvs.apply import parse_ipvsadm_save
from kubeproxy.cli import main
from kubeproxy.explain.rendered import _ipvs_parts, _with_ipvs_jumps
from kubeproxy.lab import vm
from tests.explain.test_explain import NODE, SERVICES, _destinations, _explain, _ipvs_dumps, _world

HERE = Path(__file__).parent
REPO = HERE.parents[1]
ADDRESSES_HEADER = "# ip addr add ADDRESS dev kube-ipvs0\n"

# The first test waits for the boot (guest timeout below), beyond pytest-timeout's 300 s default.
pytestmark = [pytest.mark.root, pytest.mark.timeout(1620)]


def _steps(exp: dict[str, Any]) -> list[list[tuple[str, str]]]:
    # the kernel prints a rule in its own words: rules are compared by where they are
    return [[(s["table"], s["chain"]) for s in a["steps"]] for p in exp["ports"] for a in p["addresses"]]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="module")
def render(world: Path) -> dict[str, str]:
    """The IPVS render cut into what the guest loads."""
    rendered = CliRunner().invoke(main, ["render", "--manifests", str(world), "--proxy-mode", "ipvs", *NODE[:4]])
    assert rendered.exit_code == 0, rendered.output
    ipsets, rules, table = _ipvs_parts(rendered.stdout)
    addresses = rendered.stdout[rendered.stdout.index(ADDRESSES_HEADER) + len(ADDRESSES_HEADER):]
    return {"world.ipset": ipsets, "world.iptables": _with_ipvs_jumps(rules), "world.ipvs": table,
            "world.addresses": "\n".join(ln.removeprefix("# ") for ln in addresses.splitlines()) + "\n"}


@pytest.fixture(scope="module")
def guest(world: Path, render: dict[str, str]) -> vm.VMResult:
    image = vm.build()
    files = {"repo_path": str(REPO), "world.yaml": world.read_text(), "services": "\n".join(SERVICES) + "\n",
             "node_flags": "\n".join(NODE) + "\n", **render}
    result = vm.VM(image).run((HERE / "guest_explain_ipvs.sh").read_text(), files=files, timeout=1500)
    print(f"vm: boot {result.boot_seconds:.1f} s, total {result.total_seconds:.1f} s")
    print(result.output)
    assert result.returncode == 0, result.output
    return result


def test_the_kernel_holds_the_rendered_virtual_servers(guest: vm.VMResult, render: dict[str, str]) -> None:
    held = parse_ipvsadm_save(guest.files["kernel.ipvs"])
    assert held and held == parse_ipvsadm_save(render["world.ipvs"])
    assert "-j KUBE-SERVICES" in guest.files["kernel.iptables"]


@pytest.mark.parametrize("service", SERVICES)
def test_live_explain_is_the_renders(guest: vm.VMResult, world: Path, service: str) -> None:
    key = service.replace("/", "_")
    rc = guest.files[f"live-{key}.rc"].strip()
    assert rc == "0", guest.files.get(f"live-{key}.err", "")
    live = json.loads(guest.files[f"live-{key}.json"])
    from_render = _explain(service, "--manifests", str(world), "--proxy-mode", "ipvs", *NODE)
    assert from_render["ports"]
    assert _destinations(live) == _destinations(from_render)
    assert _steps(live) == _steps(from_render)
    # the virtual servers the kernel holds are met, not only the iptables rules around them
    assert any(t == "ipvs" for steps in _steps(live) for t, _c in steps) or service == "default/empty"


def test_live_doctor_finds_what_the_dumps_give(guest: vm.VMResult, world: Path, tmp_path: Path) -> None:
    """doctor --live on the same kernel reads its virtual servers: the findings the render's dumps
    give offline (the Services they name and what about them), no NodePort reported untranslated."""
    assert guest.files["doctor.rc"].strip() in ("0", "1"), guest.files.get("doctor.err", "")
    live = json.loads(guest.files["doctor.json"])
    dumps = _ipvs_dumps(tmp_path, str(world))
    offline = CliRunner().invoke(main, ["doctor", "--rules", str(dumps["iptables"]), "--ipvs", str(dumps["ipvs"]),
                                        "--ipset-file", str(dumps["ipset"]), "--manifests", str(world), *NODE, "--json"])
    assert offline.exit_code in (0, 1), offline.output
    expected = json.loads(offline.stdout)
    assert live["inputs"]["rules"]["mode"] == expected["inputs"]["rules"]["mode"] == "ipvs"
    assert live["inputs"]["frontends_traced"] == expected["inputs"]["frontends_traced"]

    def services(report: dict[str, Any]) -> set[tuple[str, str]]:
        # the node's own conntrack and sysctls (read live, assumed offline) change numbers, not these
        return {(f["kind"], f["subject"]) for f in report["findings"]
                if f["kind"] in ("not-translated", "no-endpoints", "snat-capacity")}

    assert services(live) == services(expected)
    assert "not-translated" not in {k for k, _s in services(live)}

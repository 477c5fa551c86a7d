"""Upstream's packet-flow tests: render each scenario, trace its packets, compare the outcome.

Upstream's own tests trace packets through the rules their proxier writes
(tests/fixtures/upstream/*/flows.yaml); we run the same flows through our renderer and our
tracer. "output" is the set of possible DNAT destinations (or REJECT/DROP), "masq" whether the
packet is masqueraded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kubeproxy.backends.iptables.jumps import with_jumps
from kubeproxy.cli import main
from tests.backends.iptables.test_upstream_fixtures import FIXTURES, render_fixture

FLOWS = [
    pytest.param(
        case.name,
        i,
        flow,
        id=f"{case.name}-{i}-{flow['name']}",
    )
    for case in sorted(FIXTURES.iterdir())
    if (case / "flows.yaml").exists() and (case / "options.yaml").exists()
    for i, flow in enumerate(yaml.safe_load((case / "flows.yaml").read_text()))
]


# The addresses of upstream's fake network interfaces (lo and eth0) in these tests.
FAKE_LOCAL_IPS = ("192.168.0.2", "192.168.1.2", "192.168.99.11", "2001:db8::1", "2001:db8:1::2")


def _endpoint(text: str) -> tuple[str, str]:
    host, _, port = text.strip().rpartition(":")
    return host.strip("[]"), port


def _trace(rules: Path, flow: dict[str, Any], options: dict[str, Any]) -> list[dict[str, Any]]:
    node_ip = options["node_ip"]
    local = {node_ip, *FAKE_LOCAL_IPS, "::1"}
    where = ["--from-host"] if flow["source_ip"] in local or flow["source_ip"].startswith("127.") else ["--in-iface", "eth0"]
    family_v6 = ":" in flow["dest_ip"]
    src = f"[{flow['source_ip']}]:40000" if family_v6 else f"{flow['source_ip']}:40000"
    dst = f"[{flow['dest_ip']}]:{flow['dest_port']}" if family_v6 else f"{flow['dest_ip']}:{flow['dest_port']}"
    args = ["trace", "--rules", str(rules), "--proto", flow.get("protocol", "tcp"), "--src", src, "--dst", dst, *where, "--json"]
    # upstream's fake eth0 carries 2001:db8::1 beside the node's IPv4 address
    args += ["--iface", f"eth0={node_ip}/24", "--iface", "eth0=2001:db8::1/64", "--route", "default=eth0"]
    for ip in FAKE_LOCAL_IPS:
        args += ["--local-ip", ip]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    outcomes: list[dict[str, Any]] = json.loads(result.stdout)["outcomes"]
    return outcomes


@pytest.mark.parametrize(("case", "index", "flow"), FLOWS)
def test_upstream_flow(tmp_path: Path, case: str, index: int, flow: dict[str, Any]) -> None:
    options = yaml.safe_load((FIXTURES / case / "options.yaml").read_text())
    rules = tmp_path / "rules"
    rules.write_text(with_jumps(render_fixture(FIXTURES / case)))
    outcomes = _trace(rules, flow, options)
    expected = flow["output"]
    if expected in ("REJECT", "DROP"):
        assert {o["verdict"] for o in outcomes} == {expected}, outcomes
        return
    if expected in ("", "ACCEPT"):
        # No service rule rewrote the packet ("" means no rule matched; ACCEPT an explicit accept).
        assert all(o["dnat"] is None and o["verdict"] == "ACCEPT" for o in outcomes), outcomes
        return
    wanted = {_endpoint(d) for d in expected.split(",")}
    got = {_endpoint(o["dnat"]) if o["dnat"] else None for o in outcomes}
    assert got == wanted, outcomes
    assert {o["masquerade"] for o in outcomes} == {flow["masq"]}, outcomes

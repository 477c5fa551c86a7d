"""Shape checks for the upstream kube-proxy fixtures in tests/fixtures/upstream.

The fixtures are transcribed by hand from upstream's iptables proxier tests (see the README
there). These tests do not run our renderer; they catch transcription slips: YAML that does
not parse, missing keys, expected dumps that are not in upstream's normalised form or that
fail upstream's own jump-consistency check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import TESTS

FIXTURES = TESTS / "fixtures" / "upstream"
TRACER_ONLY = FIXTURES / "tracer_only"

OPTION_KEYS = {
    "node_name",
    "node_ip",
    "ip_family",
    "masquerade_all",
    "masquerade_bit",
    "detect_local_mode",
    "cluster_cidr",
    "node_pod_cidr",
    "bridge_interface",
    "interface_name_prefix",
    "localhost_nodeports",
    "nodeport_addresses",
    "node_port_ips",
    "random_fully",
    "nfacct_counters",
    "conntrack_tcp_liberal",
}
FLOW_KEYS = {"name", "protocol", "source_ip", "dest_ip", "dest_port", "output", "masq"}
SYNC_KEYS = {"step", "previous_step", "full_sync", "check_consistency", "changes"}
KINDS = {"Service": "v1", "EndpointSlice": "discovery.k8s.io/v1", "Node": "v1"}
DETECT_MODES = {"ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix", ""}


def fixture_dirs() -> list[Path]:
    return sorted(p.parent for p in FIXTURES.glob("*/SOURCE"))


def tracer_dirs() -> list[Path]:
    return sorted(p.parent for p in TRACER_ONLY.glob("*/SOURCE"))


# --- a re-implementation of upstream's dump parsing and normalisation (see README) ---

_TABLE = re.compile(r"^\*(.*)$")
_CHAIN = re.compile(r"^:([^ ]*) - \[([0-9]*):([0-9]*)\]$")
_RULE = re.compile(r"^-A ([^ ]*) (.*)$")
_DELETE = re.compile(r"^-X (.*)$")
_WORD = re.compile(r'(?:^|\s)("[^"]*"|[^"]\S*)')


def parse_dump(text: str) -> list[dict[str, Any]]:
    """Tables as dicts: {name, chains: [{name, decl, rules, deleted}]}, in input order."""
    tables: list[dict[str, Any]] = []
    table: dict[str, Any] | None = None
    state = "table"
    for raw in text.strip("\n").split("\n"):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if state == "table":
            m = _TABLE.match(line)
            assert m, f"expected a table line, got {line!r}"
            table = {"name": m.group(1), "chains": []}
            tables.append(table)
            state = "decls"
            continue
        assert table is not None
        if state == "decls":
            m = _CHAIN.match(line)
            if m:
                assert all(c["name"] != m.group(1) for c in table["chains"]), f"chain declared twice: {line}"
                table["chains"].append({"name": m.group(1), "decl": line, "rules": [], "deleted": False})
                continue
            state = "rules"
        chains = {c["name"]: c for c in table["chains"]}
        if m := _RULE.match(line):
            assert m.group(1) in chains, f"rule for undeclared chain: {line}"
            assert not chains[m.group(1)]["deleted"], f"rule for deleted chain: {line}"
            chains[m.group(1)]["rules"].append(line)
        elif m := _DELETE.match(line):
            assert m.group(1) in chains, f"-X of undeclared chain: {line}"
            assert not chains[m.group(1)]["rules"], f"-X after rules: {line}"
            chains[m.group(1)]["deleted"] = True
        elif line == "COMMIT":
            state = "table"
        else:
            raise AssertionError(f"unparseable line {line!r}")
    assert state == "table", "dump does not end with COMMIT"
    return tables


def rule_comment(rule: str) -> str | None:
    words: list[str] = [w.strip('"') for w in _WORD.findall(rule)]
    for i, w in enumerate(words[:-1]):
        if w == "--comment":
            return words[i + 1]
    return None


def service_key(rule: str) -> str:
    comment = rule_comment(rule) or ""
    return re.split(r"[ :]", comment, maxsplit=1)[0]


def nat_services_key(rule: str) -> tuple[bool, str]:
    # "must be the last rule" rules go last, keeping their relative order
    if "must be the last rule" in (rule_comment(rule) or ""):
        return (True, "")
    return (False, service_key(rule))


def chain_order(name: str) -> tuple[int, str]:
    if name == "KUBE-NODEPORTS":
        return (0, "")
    if name == "KUBE-SERVICES":
        return (1, "")
    return (2, name) if name.startswith("KUBE-") else (3, name)


def normalise(text: str) -> str:
    """Upstream's sortIPTablesRules, re-implemented from its description in the README."""
    tables = sorted(parse_dump(text.lstrip(" \t\n")), key=lambda t: t["name"])
    out: list[str] = []
    for table in tables:
        chains = sorted(table["chains"], key=lambda c: chain_order(c["name"]))
        for chain in chains:
            name = chain["name"]
            if name == "KUBE-NODEPORTS" or (name == "KUBE-SERVICES" and table["name"] == "filter"):
                chain["rules"] = sorted(chain["rules"], key=service_key)
            elif name == "KUBE-SERVICES" and table["name"] == "nat":
                chain["rules"] = sorted(chain["rules"], key=nat_services_key)
        out.append(f"*{table['name']}")
        out.extend(c["decl"] for c in chains)
        for c in chains:
            out.extend(c["rules"])
        out.extend(f"-X {c['name']}" for c in chains if c["deleted"])
        out.append("COMMIT")
    return "\n".join(out) + "\n"


BUILTIN_TARGETS = {"ACCEPT", "REJECT", "DROP", "MARK", "RETURN", "DNAT", "SNAT", "MASQUERADE"}
BASE_CHAINS = {
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-FORWARD",
    "KUBE-MARK-MASQ",
    "KUBE-PROXY-FIREWALL",
    "KUBE-FIREWALL",
}


def consistency_errors(text: str) -> list[str]:
    """Upstream's checkIPTablesRuleJumps, re-implemented: jumps and chains must line up."""
    errors = []
    for table in parse_dump(text):
        created = {c["name"] for c in table["chains"] if not c["deleted"]}
        filled = {c["name"] for c in table["chains"] if c["rules"]}
        jumped = set()
        for c in table["chains"]:
            for r in c["rules"]:
                jumped.update(re.findall(r"-j ([^ ]*)", r)[:1])
        jumped -= BUILTIN_TARGETS
        if missing := (jumped - created) | (filled - created):
            errors.append(f"{table['name']}: used but not created: {sorted(missing)}")
        if empty := jumped - filled - {"KUBE-NODEPORTS"}:
            errors.append(f"{table['name']}: jumped to but empty: {sorted(empty)}")
        if extra := created - jumped - BASE_CHAINS:
            errors.append(f"{table['name']}: created but unused: {sorted(extra)}")
    return errors


# --- the checks ---


def test_there_are_fixtures() -> None:
    names = {d.name for d in fixture_dirs()}
    assert "test_overall_iptables_rules" in names
    assert sum(1 for d in fixture_dirs() if (d / "expected.rules").exists()) >= 11
    assert tracer_dirs()


@pytest.mark.parametrize("d", fixture_dirs(), ids=lambda d: d.name)
def test_objects(d: Path) -> None:
    docs = [doc for doc in yaml.safe_load_all((d / "objects.yaml").read_text()) if doc is not None]
    seen = set()
    for obj in docs:
        assert isinstance(obj, dict)
        kind = obj.get("kind")
        assert kind in KINDS, kind
        assert obj.get("apiVersion") == KINDS[kind]
        meta = obj.get("metadata")
        assert isinstance(meta, dict) and isinstance(meta.get("name"), str) and meta["name"]
        if kind != "Node":
            assert isinstance(meta.get("namespace"), str) and meta["namespace"]
        key = (kind, meta.get("namespace"), meta["name"])
        assert key not in seen, f"duplicate object {key}"
        seen.add(key)
        if kind == "Service":
            ports = obj["spec"]["ports"]
            assert ports and all({"name", "port", "protocol"} <= set(p) for p in ports)
            assert all(p["protocol"] in {"TCP", "UDP", "SCTP"} for p in ports)
        if kind == "EndpointSlice":
            assert meta.get("labels", {}).get("kubernetes.io/service-name")
            assert obj.get("addressType") in {"IPv4", "IPv6"}
            for ep in obj.get("endpoints", []):
                assert ep["addresses"]
                assert set(ep.get("conditions", {})) <= {"ready", "serving", "terminating"}


@pytest.mark.parametrize("d", fixture_dirs(), ids=lambda d: d.name)
def test_options(d: Path) -> None:
    opts = yaml.safe_load((d / "options.yaml").read_text())
    assert set(opts) == OPTION_KEYS
    assert opts["ip_family"] in {"IPv4", "IPv6"}
    assert opts["detect_local_mode"] in DETECT_MODES
    assert (opts["cluster_cidr"] is not None) == (opts["detect_local_mode"] == "ClusterCIDR")
    assert isinstance(opts["masquerade_bit"], int)
    for key in ("masquerade_all", "localhost_nodeports", "random_fully", "conntrack_tcp_liberal"):
        assert isinstance(opts[key], bool), key
    for key in ("nodeport_addresses", "node_port_ips", "nfacct_counters"):
        assert isinstance(opts[key], list), key
    assert bool(opts["node_port_ips"]) <= bool(opts["nodeport_addresses"])


@pytest.mark.parametrize("d", fixture_dirs(), ids=lambda d: d.name)
def test_source_and_contents(d: Path) -> None:
    source = (d / "SOURCE").read_text()
    assert source.endswith("\n") and source.count("\n") == 1
    assert source.startswith("Test")
    assert any((d / f).exists() for f in ("expected.rules", "flows.yaml", "expected_chains.yaml"))


def check_flows(path: Path) -> None:
    flows = yaml.safe_load(path.read_text())
    assert isinstance(flows, list) and flows
    for f in flows:
        assert set(f) == FLOW_KEYS
        assert f["protocol"] in {"tcp", "udp", "sctp"}
        assert isinstance(f["dest_port"], int) and isinstance(f["masq"], bool)
        assert isinstance(f["output"], str)


@pytest.mark.parametrize("d", [d for d in fixture_dirs() if (d / "flows.yaml").exists()], ids=lambda d: d.name)
def test_flows(d: Path) -> None:
    check_flows(d / "flows.yaml")


@pytest.mark.parametrize("d", [d for d in fixture_dirs() if (d / "expected.rules").exists()], ids=lambda d: d.name)
def test_expected_rules(d: Path) -> None:
    text = (d / "expected.rules").read_text()
    assert text.startswith("*filter\n")
    assert text.endswith("COMMIT\n")
    lines = text.split("\n")
    assert lines.count("COMMIT") == 2
    assert "*nat" in lines
    # upstream writes the expected text already normalised
    assert normalise(text) == text
    sync_path = d / "sync.yaml"
    check = True
    if sync_path.exists():
        sync = yaml.safe_load(sync_path.read_text())
        assert set(sync) == SYNC_KEYS
        check = sync["check_consistency"]
    if check:
        assert consistency_errors(text) == []


@pytest.mark.parametrize("d", [d for d in fixture_dirs() if (d / "expected_chains.yaml").exists()], ids=lambda d: d.name)
def test_expected_chains(d: Path) -> None:
    chains = yaml.safe_load((d / "expected_chains.yaml").read_text())
    for c in chains:
        assert set(c) == {"table", "chain", "rules"}
        assert c["table"] in {"filter", "nat"}
        assert all(r.startswith(f"-A {c['chain']} ") for r in c["rules"])


@pytest.mark.parametrize("d", tracer_dirs(), ids=lambda d: d.name)
def test_tracer_only(d: Path) -> None:
    parse_dump((d / "input.rules").read_text())
    check_flows(d / "flows.yaml")


def test_normalise_orders_like_upstream() -> None:
    shuffled = (
        "*nat\n:KUBE-SVC-B - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:POSTROUTING - [0:0]\n"
        '-A KUBE-SERVICES -m comment --comment "x; must be the last rule" -j KUBE-NODEPORTS\n'
        '-A KUBE-SERVICES -m comment --comment "ns2/b:p cluster IP" -j KUBE-SVC-B\n'
        "-A KUBE-SERVICES -m comment --comment ns1/a:p -j KUBE-SVC-B\n"
        "-A KUBE-SVC-B -j KUBE-SEP-2\n-A KUBE-SVC-B -j KUBE-SEP-1\n"
        "COMMIT\n*filter\nCOMMIT\n"
    )
    assert normalise(shuffled) == (
        "*filter\nCOMMIT\n"
        "*nat\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-B - [0:0]\n:POSTROUTING - [0:0]\n"
        "-A KUBE-SERVICES -m comment --comment ns1/a:p -j KUBE-SVC-B\n"
        '-A KUBE-SERVICES -m comment --comment "ns2/b:p cluster IP" -j KUBE-SVC-B\n'
        '-A KUBE-SERVICES -m comment --comment "x; must be the last rule" -j KUBE-NODEPORTS\n'
        "-A KUBE-SVC-B -j KUBE-SEP-2\n-A KUBE-SVC-B -j KUBE-SEP-1\n"
        "COMMIT\n"
    )

"""`kubeproxy doctor` and `kubeproxy graph`. Only click here: the work is imported when a command runs."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:  # the rules model is imported when a command runs
    from kubeproxy.netfilter.ruleset import Ruleset

DUMP_FORMATS = ("auto", "iptables-save", "iptables-list", "nft-json", "nft")


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"kubeproxy: {message}", err=True)
    sys.exit(code)


def read_dump_file(path: str) -> str:
    from kubeproxy.netfilter.dumpfile import DumpError, read_dump

    try:
        return read_dump(path)
    except DumpError as exc:
        _fail(str(exc))


def parse_dump(path: str, fmt: str) -> Ruleset:
    """The ruleset of the dump at `path`; a dump that cannot be parsed ends the command naming it."""
    from kubeproxy.netfilter import detect
    from kubeproxy.netfilter.ruleset import ParseError

    try:
        return detect.parse(read_dump_file(path), fmt)
    except ParseError as exc:
        _fail(f"{'standard input' if path == '-' else path}: {exc}")


def csv_values(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p.strip() for v in values for p in v.split(",") if p.strip())


@click.command("doctor")
@click.option("--rules", "rules_paths", multiple=True,
              help="A dump to read (iptables-save, ip6tables-save or nft -j list ruleset; - for stdin); "
                   "repeat for an iptables node's IPv4 and IPv6 dumps.")
@click.option("--format", "fmt", default="auto", show_default=True, type=click.Choice(DUMP_FORMATS), help="Dump format.")
@click.option("--ipvs", "ipvs_path", default=None, help="With --rules of an IPVS-mode node: its `ipvsadm-save -n`.")
@click.option("--ipset-file", "ipset_path", default=None, help="With --rules: the node's `ipset save`.")
@click.option("--live", is_flag=True, help="Read this node instead (read-only): rules, sysctls, conntrack, interfaces.")
@click.option("--netns", default=None, help="With --live: read inside this network namespace.")
@click.option("--manifests", multiple=True, help="The cluster's objects: YAML/JSON files or folders (repeatable).")
@click.option("--kubeconfig", default=None, help="Read the objects from this kubeconfig's API server instead "
              "(read-only: list, as `kubeproxy run` does).")
@click.option("--master", default=None, help="The API server's address (overrides the kubeconfig's).")
@click.option("--api-timeout", default=30.0, show_default=True, type=float, help="Seconds to wait for the API server's lists.")
@click.option("--hostname-override", default="", help="This node's name (default: the only Node given).")
@click.option("--node-ip", default="", help="This node's primary IP.")
@click.option("--cluster-cidr", multiple=True, help="Pod CIDR(s), comma-separated.")
@click.option("--iface", multiple=True, help="NAME=IP/PREFIX, as for `kubeproxy trace` (repeatable).")
@click.option("--route", multiple=True, help="CIDR=IFACE[@GATEWAY] (repeatable).")
@click.option("--local-ip", multiple=True, help="An address local to the node (repeatable).")
@click.option("--in-iface", default="", help="Where outside clients' traffic arrives (default: the default route's).")
@click.option("--sysctl", "sysctls", multiple=True,
              help="NAME=VALUE of the node, e.g. net.netfilter.nf_conntrack_udp_timeout=30 (repeatable).")
@click.option("--stat", "stats", multiple=True, help="A `conntrack -S` counter, e.g. insert_failed=30493 (repeatable).")
@click.option("--conntrack", "conntrack_path", help="`conntrack -L` output of the node, for the SNAT ports in use.")
@click.option("--snat-other-flows", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="New masqueraded flows/s per Service besides the load the SNAT finding predicts (a health "
              "check, other clients): they hold ports too, and the rules cannot show them.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schema: docs/tools.md, `kubeproxy doctor`).")
def doctor(rules_paths: tuple[str, ...], fmt: str, ipvs_path: str | None, ipset_path: str | None, live: bool,
           netns: str | None, manifests: tuple[str, ...],
           kubeconfig: str | None, master: str | None, api_timeout: float, hostname_override: str, node_ip: str,
           cluster_cidr: tuple[str, ...], iface: tuple[str, ...], route: tuple[str, ...], local_ip: tuple[str, ...],
           in_iface: str, sysctls: tuple[str, ...],
           stats: tuple[str, ...], conntrack_path: str | None, snat_other_flows: float, as_json: bool) -> None:
    """What on this node will break, at what load, and why: findings worst first, each with evidence and fixes.

    Offline from a dump (--rules) or --live (read-only); the objects from --manifests or the API
    server (--kubeconfig / --master, read-only). Exit 0 when nothing is critical, 1 when something
    is, 2 on bad input.
    """
    from kubeproxy.backends.conntrack.flows import parse_flows
    from kubeproxy.cluster.manifest_load import load
    from kubeproxy.cluster.state import ClusterState
    from kubeproxy.doctor.core import DoctorInput, diagnose
    from kubeproxy.doctor.facts import FactError, NodeFacts, stats_from_flags, sysctls_from_flags
    from kubeproxy.doctor.live import LiveError, read_ipvs, read_node
    from kubeproxy.model.proxy_config import ConfigError, ProxyConfig
    from kubeproxy.netfilter.ipvs import IpvsParseError, IpvsState, load_into
    from kubeproxy.netfilter.node import Node, NodeError
    from kubeproxy.netfilter.ruleset import ParseError
    from kubeproxy.proxy.config import validate

    if bool(rules_paths) == live:
        raise click.UsageError("give exactly one of --rules FILE or --live")
    if netns and not live:
        raise click.UsageError("--netns needs --live")
    if (ipvs_path or ipset_path) and not rules_paths:
        raise click.UsageError("--ipvs and --ipset-file go with --rules (--live reads them itself)")
    try:
        cfg = validate(ProxyConfig(cluster_cidr=csv_values(cluster_cidr), hostname_override=hostname_override.strip().lower(),
                                   node_ip=node_ip))
    except ConfigError as exc:
        _fail(str(exc))
    state = ClusterState()
    notes: list[str] = []
    if manifests and (kubeconfig or master):
        raise click.UsageError("give the objects from --manifests or from the API server (--kubeconfig/--master), not both")
    if manifests:
        loaded = load(manifests, options=cfg.parse_options(from_api_server=False))
        notes += loaded.warnings
        state = loaded.state
    elif kubeconfig or master:
        from kubeproxy.doctor.from_apiserver import ApiReadError, read_objects

        # The Node to list is this node's, as for `kubeproxy run`: --hostname-override, else the hostname.
        node_name = cfg.hostname_override or socket.gethostname().strip().lower()
        try:
            listed = read_objects(kubeconfig, master, node_name, cfg.parse_options(from_api_server=True), api_timeout)
        except ApiReadError as exc:
            _fail(str(exc))
        notes += listed.warnings
        notes.append(f"objects from the {listed.source}")
        state = listed.state
    ipvs: IpvsState | None = None
    try:
        extra = Node.from_flags(list(local_ip), list(iface), list(route))
        if live:
            got = read_node(netns)
            ruleset, source, node, facts = got.ruleset, got.rules_source, got.node, got.facts
            notes += got.notes
            for name, addrs in extra.interfaces.items():
                node.interfaces.setdefault(name, []).extend(addrs)
            dumps = read_ipvs(netns)
            if dumps is not None:
                ipvs = load_into(node, *dumps)
                source += " + ipvsadm-save -n"
        else:
            ruleset = parse_dump(rules_paths[0], fmt)
            for more in rules_paths[1:]:  # e.g. the ip6tables-save dump beside the iptables-save one
                ruleset.tables += parse_dump(more, fmt).tables
            source, node, facts = ", ".join(rules_paths), extra, NodeFacts()
            if ipvs_path or ipset_path:
                ipvs = load_into(node, read_dump_file(ipvs_path) if ipvs_path else None,
                                 read_dump_file(ipset_path) if ipset_path else None)
        node.local_ips |= extra.local_ips
        node.routes = extra.routes + node.routes
        facts.sysctls.update(sysctls_from_flags(sysctls))
        facts.stats.update(stats_from_flags(stats))
        if conntrack_path:
            facts.flows = parse_flows(read_dump_file(conntrack_path))
    except (ParseError, NodeError, FactError, LiveError, IpvsParseError) as exc:
        _fail(str(exc))
    if not (manifests or kubeconfig or master):
        from kubeproxy.doctor.core import mode_of
        from kubeproxy.doctor.reconstruct import state_from_rules

        state, told = state_from_rules(ruleset, "ipvs" if ipvs is not None else mode_of(ruleset), cfg.hostname_override,
                                       node, in_iface or "eth0", ipvs)
        notes += told
    report = diagnose(DoctorInput(ruleset, state, cfg, node, facts, in_iface, source, ipvs, snat_other_flows))
    report.notes[:0] = notes
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(report.text(), nl=False)
    sys.exit(1 if any(f.severity == "critical" for f in report.findings) else 0)


@click.command("graph")
@click.option("--rules", "rules_path", help="A dump to read (iptables-save or nft -j list ruleset; - for stdin).")
@click.option("--format", "fmt", default="auto", show_default=True, type=click.Choice(DUMP_FORMATS), help="Dump format.")
@click.option("--live", is_flag=True, help="Read this node's rules instead (read-only).")
@click.option("--netns", default=None, help="With --live: read inside this network namespace.")
@click.option("--service", default=None, help="Only this Service (namespace/name).")
@click.option("-o", "--output", default="-", show_default=True,
              help="Where to write; a .svg or .png name is drawn with Graphviz's `dot`.")
def graph(rules_path: str | None, fmt: str, live: bool, netns: str | None, service: str | None, output: str) -> None:
    """The proxy's chains as a graph (DOT): KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP with each jump's share of
    new flows and the masquerade marks; in nftables mode the same through the maps."""
    from kubeproxy.doctor.graph import GraphError, build
    from kubeproxy.doctor.live import LiveError, read_rules
    from kubeproxy.netfilter.ruleset import ParseError

    if bool(rules_path) == live:
        raise click.UsageError("give exactly one of --rules FILE or --live")
    try:
        ruleset = read_rules(netns)[0] if live else parse_dump(rules_path or "-", fmt)
        text = build(ruleset, service).dot(service or "kube-proxy")
    except (ParseError, GraphError, LiveError) as exc:
        _fail(str(exc))
    _write(text, output)


def _write(text: str, output: str) -> None:
    kind = output.rsplit(".", 1)[-1].lower() if "." in output else ""
    if output == "-" or kind not in ("svg", "png", "pdf"):
        if output == "-":
            sys.stdout.write(text)
        else:
            Path(output).write_text(text, encoding="utf-8")
        return
    dot = shutil.which("dot")
    if dot is None:
        _fail(f"{output}: drawing {kind.upper()} needs Graphviz's `dot` (apt-get install graphviz); "
              "write DOT with -o FILE.dot instead")
    proc = subprocess.run([dot, f"-T{kind}", "-o", output], input=text, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        _fail(f"dot -T{kind} failed: {proc.stderr.strip()}", 1)


def register(group: Any) -> None:
    group.add_command(doctor)
    group.add_command(graph)

"""`kubeproxy explain NAMESPACE/NAME`: the command. Its inputs are doctor's (a dump, this node
read-only, or the objects rendered in a mode); the Service's addresses come from the objects when
given, else from the rules themselves (kubeproxy.doctor.reconstruct)."""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import click

from kubeproxy.doctor.commands import DUMP_FORMATS, csv_values, parse_dump, read_dump_file
from kubeproxy.proxy.mode_choice import ModeChoice


def _fail(message: str) -> NoReturn:
    click.echo(f"kubeproxy: {message}", err=True)
    sys.exit(2)


@click.command("explain")
@click.argument("service")
@click.option("--port", default=None, help="Only this port of the Service (its name or number).")
@click.option("--rules", "rules_paths", multiple=True,
              help="A dump (iptables-save, ip6tables-save, nft -j list ruleset or nft text); repeatable.")
@click.option("--format", "fmt", default="auto", show_default=True, type=click.Choice(DUMP_FORMATS), help="Dump format.")
@click.option("--ipvs", "ipvs_path", default=None, help="With --rules of an IPVS-mode node: its `ipvsadm-save -n`.")
@click.option("--ipset-file", "ipset_path", default=None, help="With --ipvs: the node's `ipset save`.")
@click.option("--live", is_flag=True, help="Read this node's rules instead (read-only).")
@click.option("--netns", default=None, help="With --live: read inside this network namespace.")
@click.option("--manifests", multiple=True,
              help="The cluster's objects (files or folders; repeatable). Alone: their rules as rendered "
                   "in --proxy-mode are explained.")
@click.option("--proxy-mode", "mode", default="iptables", show_default=True, type=ModeChoice(),
              help="With --manifests alone: the mode to render them in.")
@click.option("--hostname-override", default="", help="This node's name (default: the only Node given).")
@click.option("--node-ip", default="", help="This node's primary IP.")
@click.option("--cluster-cidr", multiple=True, help="Pod CIDR(s), comma-separated.")
@click.option("--iface", multiple=True, help="NAME=IP/PREFIX, as for `kubeproxy trace` (repeatable).")
@click.option("--route", multiple=True, help="CIDR=IFACE[@GATEWAY] (repeatable).")
@click.option("--in-iface", default="", help="Where outside clients' traffic arrives (default: the default route's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def explain(service: str, port: str | None, rules_paths: tuple[str, ...], fmt: str, ipvs_path: str | None,
            ipset_path: str | None, live: bool, netns: str | None, manifests: tuple[str, ...], mode: str,
            hostname_override: str, node_ip: str, cluster_cidr: tuple[str, ...], iface: tuple[str, ...],
            route: tuple[str, ...], in_iface: str, as_json: bool) -> None:
    """Every rule, set element and IPVS virtual server that handles SERVICE (namespace/name): per
    address (cluster IP, external and load-balancer IPs, the NodePort on each node address), in
    the order a new flow from outside meets them, and where its flows end with their shares."""
    from kubeproxy.backends import registry
    from kubeproxy.cluster.manifest_load import load
    from kubeproxy.cluster.state import ClusterState
    from kubeproxy.doctor.address_probe import nodeport_ips
    from kubeproxy.doctor.core import DoctorInput, families_of, mode_of, node_context
    from kubeproxy.doctor.live import LiveError, read_ipvs, read_rules
    from kubeproxy.explain.rendered import read_render
    from kubeproxy.explain.service_walk import explain as explain_service
    from kubeproxy.explain.text import render_text, to_json
    from kubeproxy.model.contract import OfflineOptions
    from kubeproxy.model.node_model import build_view
    from kubeproxy.model.proxy_config import ConfigError, ProxyConfig
    from kubeproxy.netfilter.ipvs import IpvsParseError, load_into
    from kubeproxy.netfilter.node import Node, NodeError
    from kubeproxy.netfilter.ruleset import ParseError
    from kubeproxy.proxy.config import validate

    namespace, _, name = service.partition("/")
    if not namespace or not name or "/" in name:
        raise click.UsageError(f"SERVICE is namespace/name, not {service!r}")
    if sum((bool(rules_paths), live)) > 1 or not (rules_paths or live or manifests):
        raise click.UsageError("give one of --rules DUMP, --live or --manifests FILE")
    if (ipvs_path or ipset_path) and not rules_paths:
        raise click.UsageError("--ipvs and --ipset-file go with --rules")
    try:
        cfg = validate(ProxyConfig(cluster_cidr=csv_values(cluster_cidr), hostname_override=hostname_override.strip().lower(),
                                   node_ip=node_ip, mode=mode))
        node = Node.from_flags([], list(iface), list(route))
    except (ConfigError, NodeError) as exc:
        _fail(str(exc))
    state, notes = ClusterState(), []
    if manifests:
        loaded = load(manifests, options=cfg.parse_options(from_api_server=False))
        state, notes = loaded.state, list(loaded.warnings)
    ipvs = None
    try:
        if rules_paths:
            ruleset = parse_dump(rules_paths[0], fmt)
            for more in rules_paths[1:]:
                ruleset.tables += parse_dump(more, fmt).tables
            if ipvs_path:
                ipvs = load_into(node, read_dump_file(ipvs_path), read_dump_file(ipset_path) if ipset_path else None)
            elif ipset_path:
                load_into(node, None, read_dump_file(ipset_path))
        elif live:
            ruleset, _, more_notes = read_rules(netns)
            notes += more_notes
            dumps = read_ipvs(netns)
            if dumps is not None:
                ipvs = load_into(node, *dumps)
        else:
            out = registry.offline_renderer(mode)(state, cfg, OfflineOptions(with_jumps=True))
            fmt = registry.mode(mode).render_format
            if not fmt:
                _fail(f"--proxy-mode {mode}: explain cannot read this mode's rules; give --rules or --live instead")
            ruleset, ipvs = read_render(out.text, fmt, node)
            notes += [f"rules as `kubeproxy render --proxy-mode {mode}` makes them for these objects"]
    except (ParseError, LiveError, IpvsParseError, ConfigError, ValueError) as exc:
        _fail(str(exc))
    ctx = node_context(DoctorInput(ruleset, state, cfg, node, in_iface=in_iface))
    if not manifests:
        from kubeproxy.doctor.reconstruct import state_from_rules

        rules_mode = "ipvs" if ipvs is not None else mode_of(ruleset)
        state, told = state_from_rules(ruleset, rules_mode, ctx.name, ctx.node, ctx.in_iface, ipvs)
        notes += told
    views = {f: build_view(state.services.values(), state.slices.values(), f, ctx.name) for f in families_of(ruleset)}
    result = explain_service(ruleset, ctx.node, views, namespace, name, port, nodeport_ips(ruleset, ctx.node_ips, ipvs),
                             ctx.in_iface, ipvs, ctx.name)
    if as_json:
        click.echo(json.dumps({**to_json(result), "notes": notes + ctx.notes}, indent=2))
    else:
        click.echo(render_text(result), nl=False)
        for note in notes + ctx.notes:
            click.echo(f"note: {note}")
    sys.exit(0 if result.ports else 1)

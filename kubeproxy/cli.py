"""The command line: parses flags (upstream names where upstream has them) and calls the layers."""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import click

from kubeproxy import __version__
from kubeproxy.cluster.errors import ManifestError
from kubeproxy.model.proxy_config import ConfigError, ProxyConfig, parse_duration
from kubeproxy.proxy.config import DETECT_LOCAL_MODES, load_config_file, validate
from kubeproxy.proxy.mode_choice import ModeChoice
from kubeproxy.runtime import logs

# netfilter.detect's FORMATS, spelled here so that every command does not import the rules model
# (70 ms) to build `trace --format`'s choices; tests/cli/test_cold_imports.py keeps the two equal.
DUMP_FORMATS = ("iptables-save", "iptables-list", "nft-json", "nft")
# What the `lab` extra installs (pyproject.toml): the demo, the DNS lab and the plots need it,
# the proxy does not, so a node image goes without.
LAB_EXTRA_MODULES = frozenset({"rich", "matplotlib"})


class LazyGroup(click.Group):
    """Subcommands that live beside what they drive, imported only when they are run or listed.

    `kubeproxy run` and `kube-proxy` must not load the lab (test beds, the DNS load generator,
    matplotlib) or the doctor: a proxy starts faster and carries less in memory without them.
    """

    LAZY: ClassVar[dict[str, str]] = {
        "dns": "kubeproxy.lab.dns.command_group:dns",
        "lab": "kubeproxy.lab.dns.command_group:lab",
        "doctor": "kubeproxy.doctor.commands:doctor",
        "graph": "kubeproxy.doctor.commands:graph",
        "explain": "kubeproxy.explain.command:explain",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY:
            module, _, attr = self.LAZY[cmd_name].partition(":")
            command: click.Command = getattr(importlib.import_module(module), attr)
            return command
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as exc:
            package = (exc.name or "").partition(".")[0]
            if package not in LAB_EXTRA_MODULES:
                raise
            raise click.ClickException(
                f"`kubeproxy {ctx.invoked_subcommand}` needs {package}, from kubeproxy's lab extra: "
                "pip install 'kubeproxy[lab]'"
            ) from None


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="kubeproxy")
@click.option("-v", "--v", "verbosity", type=int, default=0, help="Log verbosity, as upstream's -v (0-9).")
@click.pass_context
def main(ctx: click.Context, verbosity: int) -> None:
    """A Kubernetes service proxy (drop-in kube-proxy), and tools that explain what it does to packets."""
    ctx.obj = {"verbosity": verbosity}
    logs.setup(verbosity, "text")


def kube_proxy(argv: list[str] | None = None) -> None:
    """The `kube-proxy` command: upstream's command line, flags and --config exactly (see proxy/flags.py)."""
    sys.exit(_serve_proxy(sys.argv[1:] if argv is None else argv, prog="kube-proxy"))


def _serve_proxy(args: list[str], *, prog: str, verbosity: int = 0) -> int:
    """The proxy (proxy/kube_proxy.py), with the cyclic collector off from before its imports.

    Importing the proxy's modules makes 0.15 s of objects and no garbage, and the collections they
    trigger were 40-50 ms of every start-up. The proxy then keeps the collector off until its first
    sync is over (live.py); if it returns before that, the collector is as it was.
    """
    from kubeproxy.cluster.bulk import paused_gc

    with paused_gc():
        from kubeproxy.proxy import kube_proxy

        return kube_proxy.main(args, prog=prog, verbosity=verbosity)


def _split_csv(values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def proxy_options(func: Any) -> Any:
    """The upstream kube-proxy flags that change which rules a node gets."""
    options = [
        click.option("--config", "config_file", type=click.Path(dir_okay=False), help="KubeProxyConfiguration file."),
        click.option("--proxy-mode", type=ModeChoice(), help="Which backend to use."),
        click.option("--hostname-override", help="This node's name (decides which endpoints are local)."),
        click.option("--node-ip", help="This node's IP, or a dual-stack pair 'IPv4,IPv6' (the first is the primary; "
                     "otherwise taken from the Node object)."),
        click.option("--cluster-cidr", multiple=True, help="Pod CIDR(s) of the cluster, comma-separated."),
        click.option("--detect-local-mode", type=click.Choice(DETECT_LOCAL_MODES), help="How to tell pod traffic."),
        click.option("--pod-bridge-interface", help="Bridge of local pods (BridgeInterface mode)."),
        click.option("--pod-interface-name-prefix", help="Interface prefix of local pods (InterfaceNamePrefix mode)."),
        click.option("--masquerade-all/--no-masquerade-all", default=None, help="SNAT all traffic to service IPs."),
        click.option("--iptables-masquerade-bit", type=int, help="fwmark bit for packets to masquerade (0-31)."),
        click.option(
            "--iptables-localhost-nodeports/--no-iptables-localhost-nodeports",
            default=None,
            help="Allow NodePorts on 127.0.0.1 (IPv4).",
        ),
        click.option("--nodeport-addresses", multiple=True,
                     help="CIDRs and/or 'primary', 'localhost', 'all' where NodePorts answer "
                     "(unset: 'primary' in nftables mode, every address otherwise)."),
        click.option("--iptables-random-fully/--no-iptables-random-fully", default=None, help="MASQUERADE --random-fully."),
        click.option("--ipvs-scheduler", help="IPVS scheduler for ipvs mode (rr, wrr, lc, wlc, sh, dh, sed, nq, mh)."),
        click.option(
            "--service-node-port-range",
            help="The API server's node port range (default 30000-32767): manifest objects with a nodePort "
            "or healthCheckNodePort outside it are skipped. Objects from an API server are checked only if given.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def build_config(**flags: Any) -> ProxyConfig:
    cfg = ProxyConfig()
    if flags.get("config_file"):
        cfg = load_config_file(flags["config_file"], cfg)
    mapping = {
        "proxy_mode": "mode",
        "hostname_override": "hostname_override",
        "node_ip": "node_ip",
        "detect_local_mode": "detect_local_mode",
        "pod_bridge_interface": "bridge_interface",
        "pod_interface_name_prefix": "interface_name_prefix",
        "masquerade_all": "masquerade_all",
        "iptables_masquerade_bit": "masquerade_bit",
        "iptables_localhost_nodeports": "localhost_nodeports",
        "iptables_random_fully": "random_fully",
        "service_node_port_range": "service_node_port_range",
    }
    changes = {field: flags[flag] for flag, field in mapping.items() if flags.get(flag) is not None}
    if flags.get("cluster_cidr"):
        changes["cluster_cidr"] = _split_csv(flags["cluster_cidr"])
    if flags.get("nodeport_addresses"):
        changes["nodeport_addresses"] = _split_csv(flags["nodeport_addresses"])
    if flags.get("ipvs_scheduler"):
        changes["ipvs"] = {**cfg.ipvs, "scheduler": flags["ipvs_scheduler"]}
    return validate(replace(cfg, **changes))


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(f"kubeproxy: {message}", err=True)
    sys.exit(code)


@main.command()
@proxy_options
@click.option("--manifests", "manifests", multiple=True, required=True, help="YAML/JSON files or folders (repeatable).")
@click.option("--nfacct/--no-nfacct", default=True, help="Whether the node's kernel has nfacct counters.")
@click.option("--conntrack-tcp-be-liberal", is_flag=True, help="The node sets nf_conntrack_tcp_be_liberal.")
@click.option(
    "--with-jumps",
    is_flag=True,
    help="Also append upstream's jumps from PREROUTING, INPUT, ... (installed separately by kube-proxy), "
    "for a self-contained rule set to trace.",
)
def render(manifests: tuple[str, ...], nfacct: bool, conntrack_tcp_be_liberal: bool, with_jumps: bool, **flags: Any) -> None:
    """Print the rules upstream kube-proxy would program for these objects.

    For --proxy-mode iptables: the iptables-restore --noflush input of a full sync.
    For --proxy-mode nftables: the `nft -f` input of the `kube-proxy` table.
    For --proxy-mode ipvs: the `ipset restore` input, the iptables-restore input and the IPVS
    table in `ipvsadm-save -n` form, with the addresses for kube-ipvs0.
    Objects that cannot be used are skipped with a warning on stderr.
    """
    from kubeproxy.cluster.bulk import paused_gc

    try:
        cfg = build_config(**flags)
    except (ConfigError, ManifestError) as exc:
        _fail(str(exc))
    # A one-shot command whose objects all live until it exits (300k at 10k services): the cyclic
    # collector would walk them again and again while the view and the rules are built (0.6 s of
    # 2.8 s at 10k x 10, bench/decode.py), and there is no cycle to find. Reference counting
    # still frees the temporaries.
    with paused_gc():
        _render(cfg, manifests, offline_args=(nfacct, conntrack_tcp_be_liberal, with_jumps))


def _render(cfg: ProxyConfig, manifests: tuple[str, ...], offline_args: tuple[bool, bool, bool]) -> None:
    from kubeproxy.backends import registry
    from kubeproxy.cluster.manifest_load import load
    from kubeproxy.model.contract import OfflineOptions

    loaded = load(manifests, options=cfg.parse_options(from_api_server=False))
    for warning in loaded.warnings:
        click.echo(f"kubeproxy: {warning}", err=True)
    if loaded.objects == 0:
        _fail("no objects could be read", 1)
    _render_diagnostics(loaded.state, cfg)
    renderer = registry.offline_renderer(cfg.mode)
    try:
        out = renderer(loaded.state, cfg, OfflineOptions(*offline_args))
    except ConfigError as exc:
        _fail(str(exc))
    for warning in out.warnings:
        click.echo(f"kubeproxy: {warning}", err=True)
    sys.stdout.write(out.text)


def _render_diagnostics(state: Any, cfg: ProxyConfig) -> None:
    """The start-up warnings `run` would log about the node and the configuration, on stderr."""
    from kubeproxy.model.node_choice import node_choice
    from kubeproxy.proxy.config import unused_settings
    from kubeproxy.proxy.startup import node_facts

    choice = node_choice(state, cfg)
    for warning in (*choice.warnings, *node_facts(cfg, choice.node).warnings, *unused_settings(cfg)):
        click.echo(f"kubeproxy: warning: {warning}", err=True)


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None


@main.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False, "help_option_names": []},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_cmd(ctx: click.Context, args: tuple[str, ...]) -> None:
    """Run the proxy on this node, with upstream kube-proxy's flags (`kubeproxy run --help`).

    The same as the `kube-proxy` command: --config, --hostname-override, -v and every other
    upstream flag, with upstream's syntax and precedence; plus --manifests to read objects from
    files instead of an API server. The rules stay in the kernel when the proxy exits.
    """
    verbosity = (ctx.obj or {}).get("verbosity", 0)
    sys.exit(_serve_proxy(list(args), prog="kubeproxy run", verbosity=verbosity))


@main.command()
@click.option("--ipv6", is_flag=True, help="Clean only the IPv6 tables (ip6tables, ip6 kube-proxy).")
def cleanup(ipv6: bool) -> None:
    """Remove what kubeproxy installed in any mode, for both IP families, and nothing else.

    The same as `kube-proxy --cleanup`: each mode's cleanup (backends/registry.py), e.g.
    iptables mode's chains and jumps, nftables mode's `kube-proxy` tables, userspace mode's
    KUBE-PORTALS-*/KUBE-NODEPORT-* chains, ipvs mode's IPVS table, kube-ipvs0, ipsets and chains.

    Chains shared with kubelet (KUBE-MARK-MASQ, KUBE-FIREWALL) go only if nothing else uses them.
    """
    from kubeproxy.backends import registry
    from kubeproxy.kernel.exec import local_run
    from kubeproxy.model.options import Family

    done = registry.cleanup_all(local_run, [Family.IPV6] if ipv6 else list(Family))
    for item in done.removed:
        click.echo(f"removed {item}")
    if not done.removed:
        click.echo("nothing to remove")
    for error in done.errors:
        click.echo(f"kubeproxy: cleanup failed: {error}", err=True)
    if done.errors:
        sys.exit(1)


@main.command()
@click.option("--offline", is_flag=True, help="Only render the bundled example and explain the rules (no root needed).")
@click.option("--manifests", multiple=True, help="Objects to explain instead of the bundled example (implies --offline).")
@click.option("--hostname-override", default="", help="The node to explain the rules of (offline; default: the only Node given).")
@click.option("--cluster-cidr", default="10.244.0.0/16", show_default=True, help="Pod CIDR(s), comma-separated (offline).")
def demo(offline: bool, manifests: tuple[str, ...], hostname_override: str, cluster_cidr: str) -> None:
    """A live node in network namespaces running `kubeproxy run`, with real traffic (as root).

    Without root, or with --offline: render the bundled example cluster and explain the rules,
    service by service.
    """
    from kubeproxy.backends.iptables.offline import render_iptables
    from kubeproxy.cluster.manifest_load import load
    from kubeproxy.demo_report import show

    if not offline and not manifests:
        from kubeproxy.lab import live_demo

        reason = live_demo.unavailable()
        if reason is None:
            sys.exit(live_demo.run())
        click.echo(f"kubeproxy demo: {reason}; showing the offline demo instead (kubeproxy demo --offline).")

    paths = list(manifests) or [str(Path(str(resources.files("kubeproxy") / "examples" / "demo.yaml")))]
    loaded = load(paths)
    try:
        cfg = validate(ProxyConfig(cluster_cidr=_split_csv((cluster_cidr,)), hostname_override=hostname_override.strip().lower()))
        rendering = render_iptables(loaded.state, cfg)
    except ConfigError as exc:
        _fail(str(exc))
    _render_diagnostics(loaded.state, cfg)
    show(loaded, rendering, cfg)


@main.command("trace")
@click.option("--rules", "rules_path", required=True, help="Dump to read (a file, or - for stdin).")
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(["auto", *DUMP_FORMATS]), help="Dump format.")
@click.option("--proto", default="tcp", show_default=True, help="tcp, udp, icmp, sctp or a number.")
@click.option("--src", required=True, help="Source IP[:PORT].")
@click.option("--dst", required=True, help="Destination IP:PORT.")
@click.option("--in-iface", default=None, help="Interface the packet arrives on.")
@click.option("--from-host", is_flag=True, help="The packet is sent by a process on the node.")
@click.option("--state", "ct_state", default="NEW", show_default=True, help="Conntrack state of the packet.")
@click.option("--mark", default="0", show_default=True, help="Packet mark on arrival.")
@click.option("--physdev-in", default=None, help="Bridge port the packet came through (physdev).")
@click.option("--physdev-out", default=None,
              help="Bridge port a bridged packet leaves by (with --physdev-in; the packet is bridged, not routed).")
@click.option("--local-ip", multiple=True, help="An address local to the node (repeatable).")
@click.option("--iface", multiple=True, help="NAME=IP/PREFIX: an interface and its address (repeatable).")
@click.option("--route", multiple=True, help="CIDR=IFACE[@GATEWAY] ('default' for 0.0.0.0/0; repeatable).")
@click.option("--ipset", multiple=True, help="NAME=MEMBER: ipset contents (repeatable).")
@click.option("--ipset-file", "ipset_file", default=None,
              help="`ipset save` output: every set's members and type (added to --ipset).")
@click.option("--ipvs", "ipvs_file", default=None,
              help="`ipvsadm-save -n` or `ipvsadm -Ln` output: the IPVS virtual services (an IPVS-mode node).")
@click.option("--affinity", multiple=True, help="NAME=IP: an entry of a `recent` list (repeatable).")
@click.option("--live", is_flag=True, help="Read interfaces and routes from this host (read-only).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def trace_cmd(
    rules_path: str, fmt: str, proto: str, src: str, dst: str, in_iface: str | None, from_host: bool,
    ct_state: str, mark: str, physdev_in: str | None, physdev_out: str | None, local_ip: tuple[str, ...], iface: tuple[str, ...],
    route: tuple[str, ...], ipset: tuple[str, ...], ipset_file: str | None, ipvs_file: str | None,
    affinity: tuple[str, ...], live: bool, as_json: bool,
) -> None:
    """Follow a packet through an iptables or nftables dump: every outcome, with its probability."""
    # Here, not at the top: the simulator is only for `trace`; `render` and `run` start without it.
    from kubeproxy.netfilter import detect as nf_detect
    from kubeproxy.netfilter import ipvs as nf_ipvs
    from kubeproxy.netfilter import simulate as nf_simulate
    from kubeproxy.netfilter.node import Node, NodeError
    from kubeproxy.netfilter.packet import PacketError, make_packet
    from kubeproxy.netfilter.ruleset import ParseError
    from kubeproxy.netfilter.simulate import result_text

    if bool(in_iface) == from_host:
        raise click.UsageError("give exactly one of --in-iface IF or --from-host")
    from kubeproxy.netfilter.dumpfile import DumpError, read_dump

    try:
        text = read_dump(rules_path)
    except DumpError as e:
        raise click.UsageError(f"--rules {e}") from None
    dumps: dict[str, str | None] = {}
    for flag, path in (("--ipset-file", ipset_file), ("--ipvs", ipvs_file)):
        try:
            dumps[flag] = read_dump(path) if path is not None else None
        except DumpError as e:
            raise click.UsageError(f"{flag} {e}") from None
    try:
        ruleset = nf_detect.parse(text, fmt)
    except ParseError as e:
        click.echo(f"error: --rules {'standard input' if rules_path == '-' else rules_path}: {e}", err=True)
        sys.exit(2)
    try:
        node = Node.from_live() if live else Node.from_flags()
        extra = Node.from_flags(list(local_ip), list(iface), list(route), list(ipset), list(affinity))
        for name, addrs in extra.interfaces.items():
            node.interfaces.setdefault(name, []).extend(a for a in addrs if a not in node.interfaces.get(name, []))
        node.local_ips |= extra.local_ips
        node.routes = extra.routes + node.routes
        node.ipsets, node.recent = extra.ipsets, extra.recent
        ipvs_state = nf_ipvs.load_into(node, dumps["--ipvs"], dumps["--ipset-file"])
        packet = make_packet(proto, src, dst, in_iface, ct_state, int(mark, 0), physdev_in, physdev_out)
        result = nf_simulate.trace(ruleset, node, packet, ipvs=ipvs_state)
    except (ParseError, NodeError, PacketError, nf_simulate.TraceError) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except RecursionError:  # an expression nested within the parser's bound but past the walk's stack
        click.echo(f"error: --rules {rules_path}: an expression is nested too deeply to evaluate", err=True)
        sys.exit(2)
    except ValueError as e:  # e.g. a bad --mark
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(result_text.to_json(result), indent=2))
    else:
        click.echo(result_text.render_text(result), nl=False)

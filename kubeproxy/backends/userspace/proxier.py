"""The userspace backend: the proxy relays each connection itself; iptables only redirects.

A sync (called by the live loop in its worker thread):

1. Per service port (TCP and UDP) a listener: kept for as long as the port exists, so a
   change of endpoints never touches established connections. New ones are bound here, in
   the configured `--proxy-port-range`.
2. The endpoints each port balances over (`proxy/topology.categorize`, as the kernel modes
   decide: ready ones, else serving-terminating ones; local ones for internalTrafficPolicy
   Local) become immutable `PortTable`s, handed to the relay loop together with the new
   listeners; the call returns once the loop serves them.
3. The redirect rules (`render.py`) in one `iptables-restore --noflush` (our five chains are
   rewritten whole, nothing else is touched). Listeners of ports that went away close after
   the rules that led to them are gone.

The relay loop (`relay_loop.py`) runs on its own thread from `prepare` on, so traffic never waits
for a sync and a sync never waits for traffic. After each sync the proxier writes what it
serves (`state_file`: proxy port and endpoints per service port) where test beds and people
can read it, since, unlike the kernel modes, the rules do not show the endpoints.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.backends.iptables.apply import RestoreError, check_restore, iptables_tool, restore
from kubeproxy.backends.userspace import render as R
from kubeproxy.backends.userspace.balancer import PortTable
from kubeproxy.backends.userspace.ports import Binder, PortsExhausted, parse_port_range
from kubeproxy.backends.userspace.relay import HAVE_SPLICE
from kubeproxy.backends.userspace.relay_loop import DEFAULT_UDP_TIMEOUT, Listener, RelayServer, fd_budget, raise_nofile
from kubeproxy.kernel.exec import Runner, local_run
from kubeproxy.model.metrics import FamilyMetrics
from kubeproxy.model.node_model import NodeView, ServicePortInfo, ServicePortName
from kubeproxy.model.options import Family, NodeOptions
from kubeproxy.model.topology import categorize
from kubeproxy.runtime.logs import kv

log = logging.getLogger("kubeproxy.userspace")

STATE_DIR = Path("/run/kubeproxy")


def netns_id() -> str:
    """This process's network namespace inode: the state file's name, so a reader in the same
    namespace (`readlink /proc/self/ns/net`) finds the proxy that serves it."""
    link = os.readlink("/proc/self/ns/net")  # "net:[4026531840]"
    return link[link.find("[") + 1 : link.rfind("]")]


def state_path(directory: Path = STATE_DIR, ns: str | None = None, family: Family = Family.IPV4) -> Path:
    """The state file of `family`'s proxy in namespace `ns`: a dual-stack node runs one proxier
    per family, each writes its own (the IPv4 name is the one single-stack nodes always had)."""
    return directory / f"userspace-net-{ns or netns_id()}{'-' + family if family.ipv6 else ''}.json"


def for_family(path: Path, family: Family) -> Path:
    """`path` (an IPv4 state file's) for `family`: the same place, state_path's name."""
    return path.with_name(f"{path.stem}-{family}{path.suffix}") if family.ipv6 else path


@dataclass(frozen=True)
class SyncReport:
    full: bool
    rendered: R.Rendered
    listeners: int
    no_local_endpoints_internal: int = 0
    no_local_endpoints_external: int = 0
    render_seconds: float = 0.0
    restore_seconds: float = 0.0

    @property
    def rule_counts(self) -> dict[str, int]:
        return {"filter": self.rendered.filter_rules, "nat": self.rendered.nat_rules}

    @property
    def written_rule_counts(self) -> dict[str, int]:
        return {}  # upstream sets this gauge in its iptables mode only


def port_table(name: ServicePortName, svc: ServicePortInfo, view: NodeView, opts: NodeOptions) -> tuple[PortTable, bool, bool]:
    """The port's table, and whether it lacks local endpoints for its internal / external Local policy."""
    cat = categorize(view.endpoints.get(name, []), svc, opts.node_name, opts.node_labels, prefer_same_node=opts.prefer_same_node)
    # The relay sees neither where a connection came from nor keeps its source address, so it
    # cannot tell external from internal traffic: internalTrafficPolicy decides for both.
    chosen = cat.local if svc.internal_policy_local else cat.cluster
    table = PortTable(
        name,
        svc.protocol,
        tuple((e.ip, e.port) for e in chosen),
        affinity=svc.client_ip_affinity,
        affinity_timeout=float(svc.sticky_max_age_seconds),
    )
    return table, svc.internal_policy_local and not cat.local, svc.external_policy_local and not cat.local


@dataclass
class UserspaceProxier:
    # One family per proxy (the live loop sets it before each sync), as upstream's userspace mode.
    family: Family = Family.IPV4
    run: Runner = local_run
    variant: str = ""
    sync_period: float = 30.0
    port_range: str = ""
    # Upstream's listenIP (--bind-address): "" binds the any address and REDIRECTs; an address
    # binds there only and DNATs to it (for pods behind unnumbered interfaces).
    listen_ip: str = ""
    udp_timeout: float = DEFAULT_UDP_TIMEOUT
    splice: bool = HAVE_SPLICE
    state_file: Path | None = None  # None: not written
    nfacct_counters: tuple[str, ...] = field(default=(), init=False)
    server: RelayServer | None = field(default=None, init=False)
    binder: Binder = field(init=False)
    _ports: dict[ServicePortName, int] = field(default_factory=dict, init=False)
    _jumps_checked: bool = field(default=False, init=False)
    _restored: str | None = field(default=None, init=False)  # the rules text the kernel was last given

    def __post_init__(self) -> None:
        self.binder = Binder(parse_port_range(self.port_range))

    @property
    def ipv6(self) -> bool:
        return self.family.ipv6

    def _binary(self, suffix: str = "") -> str:
        return iptables_tool(self.family, self.variant, suffix)

    def _relay(self) -> RelayServer:
        if self.server is None:
            self.server = RelayServer(udp_timeout=self.udp_timeout, splice=self.splice, max_fds=fd_budget(raise_nofile()))
            self.server.start()
            log.info(kv("Userspace relay started", splice=self.splice, fdBudget=self.server.max_fds, udpTimeout=self.udp_timeout))
        return self.server

    def _listen_ip(self, opts: NodeOptions) -> str:
        """The bind address, when it is of the family being proxied and not the any address."""
        if not self.listen_ip:
            return ""
        ip = ipaddress.ip_address(self.listen_ip)
        return str(ip) if not ip.is_unspecified and Family.of(ip) == opts.family else ""

    def prepare(self) -> None:
        self._relay()

    def ensure_jumps(self) -> int:
        """The jumps from the built-in chains (upstream's iptablesInit), added where missing."""
        added = 0
        for j in R.JUMPS:
            args = [j.builtin, *shlex.split(j.match), "-j", j.target]
            if self.run([self._binary(), "-w", "-t", j.table, "-C", *args], check=False).returncode == 0:
                continue
            # A chain must exist before a rule can jump to it.
            self.run([self._binary(), "-w", "-t", j.table, "-N", j.target], check=False)
            self.run([self._binary(), "-w", "-t", j.table, "-I" if j.prepend else "-A", *args], check=True)
            added += 1
        return added

    def rules_intact(self) -> bool:
        """Never asked: the mode syncs every syncPeriod, which puts back whatever was lost."""
        return True

    def sync(self, view: NodeView, opts: NodeOptions, changed_services: frozenset[tuple[str, str]] | None) -> SyncReport:
        relay = self._relay()
        full = changed_services is None
        started = time.perf_counter()
        tables: dict[ServicePortName, PortTable] = {}
        opened: list[Listener] = []
        no_local_int = no_local_ext = 0
        for name, svc in view.services.items():
            if svc.protocol not in R.PROTOCOLS:
                continue
            table, lacks_int, lacks_ext = port_table(name, svc, view, opts)
            no_local_int += lacks_int
            no_local_ext += lacks_ext
            if name not in self._ports:
                try:
                    sock, port = self.binder.open(svc.protocol, opts.family, self._listen_ip(opts))
                except PortsExhausted as exc:
                    # This port goes unserved (no rule either); every other one is synced.
                    log.error(kv("Failed to open a proxy port", servicePortName=str(name), err=exc))
                    continue
                opened.append(Listener(name, svc.protocol, sock, port))
                self._ports[name] = port
                log.info(kv("Opened proxy port", servicePortName=str(name), protocol=svc.protocol, port=port))
            tables[name] = table
        closed = [name for name in self._ports if name not in tables]
        # Serve first, redirect second: a rule never leads to a port nobody listens on.
        relay.call(relay.adopt, opened, tables, [])
        ports = {name: port for name, port in self._ports.items() if name in tables}
        rendered = R.render(view, opts, ports, self._listen_ip(opts))
        rendered_at = time.perf_counter()
        if full or not self._jumps_checked:
            self.ensure_jumps()
            self._jumps_checked = True
        # The redirects have nothing per endpoint: an endpoint change leaves the text as it was and
        # only the relay's tables change (upstream's userspace proxier did not touch iptables then
        # either). A full sync restores anyway, which puts back rules wiped behind our back.
        if full or rendered.text != self._restored:
            restore(rendered.text, self.run, family=self.family, variant=self.variant)
            self._restored = rendered.text
        done = time.perf_counter()
        if closed:
            relay.call(relay.adopt, [], tables, closed)
            for name in closed:
                log.info(kv("Closed proxy port", servicePortName=str(name), port=self._ports.pop(name)))
        self._write_state(tables)
        return SyncReport(full, rendered, len(ports), no_local_int, no_local_ext, rendered_at - started, done - rendered_at)

    @property
    def family_state_file(self) -> Path | None:
        """Where this family's proxier writes its state (`state_file` names the IPv4 one)."""
        return None if self.state_file is None else for_family(self.state_file, self.family)

    def _write_state(self, tables: dict[ServicePortName, PortTable]) -> None:
        path = self.family_state_file
        if path is None:
            return
        doc = {
            "pid": os.getpid(),
            "ports": {
                str(name): {"protocol": t.protocol, "proxyPort": self._ports[name], "endpoints": list(t.addresses)}
                for name, t in sorted(tables.items())
                if name in self._ports
            },
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(doc, indent=1))
            tmp.replace(path)  # readers never see half a file
        except OSError as exc:
            log.warning(kv("Could not write the userspace state file", path=str(path), err=exc))

    def check(self, view: NodeView, opts: NodeOptions) -> str | None:
        # Ports not yet open are rendered with a stand-in: the check is about the rules' text.
        ports = {name: self._ports.get(name, 1) for name, svc in view.services.items() if svc.protocol in R.PROTOCOLS}
        text = R.render(view, opts, ports, self._listen_ip(opts)).text
        return check_restore(text, self.run, family=self.family, variant=self.variant)

    def record_failure(self, metrics: FamilyMetrics, exc: Exception, partial: bool) -> None:
        log.error('"Failed to execute iptables-restore" err="%s"', exc)
        metrics.restore_failures_total.inc()
        if partial:
            metrics.partial_restore_failures_total.inc()

    def cleanup(self) -> list[str]:
        """Remove our jumps and chains, stop the relay, and forget the state file."""
        removed: list[str] = []
        for j in R.JUMPS:
            args = [j.builtin, *shlex.split(j.match), "-j", j.target]
            while self.run([self._binary(), "-w", "-t", j.table, "-D", *args], check=False).returncode == 0:
                removed.append(f"{j.table} {j.builtin} -> {j.target}")
        for table, chains in (("nat", R.NAT_CHAINS), ("filter", R.FILTER_CHAINS)):
            saved = self.run([self._binary("-save"), "-t", table], check=False)
            present = [c for c in chains if f":{c} " in saved.stdout]
            if not present:
                continue
            text = "\n".join([f"*{table}", *(f":{c} - [0:0]" for c in present), *(f"-X {c}" for c in present), "COMMIT", ""])
            try:
                restore(text, self.run, family=self.family, variant=self.variant)
                removed.extend(f"{table} {c}" for c in present)
            except RestoreError as exc:
                log.error("could not remove the userspace chains of %s: %s", table, exc)
        if self.server is not None:
            self.server.stop()
            self.server = None
            self._ports.clear()
        path = self.family_state_file
        if path is not None and path.exists():
            path.unlink()
        return removed

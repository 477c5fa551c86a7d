"""Upstream kube-proxy's command line (`kube-proxy`, `kubeproxy run`): every flag, pflag's syntax,
upstream's precedence between flags and --config, --write-config-to, and the start-up refusals."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from kubeproxy.model.proxy_config import ConfigError
from kubeproxy.proxy import flags
from kubeproxy.proxy.config import load_config_file, to_kube_proxy_configuration
from kubeproxy.proxy.flags import FLAGS, FlagError, Invocation, go_duration, parse, resolve
from tests.paths import REPO as ROOT

BIN = Path(sys.executable).parent
KUBE_PROXY = BIN / "kube-proxy"
DEMO = ROOT / "kubeproxy" / "examples" / "demo.yaml"
# Flags that keep a test process from touching this machine's conntrack sysctls.
NO_SYSCTLS = ["--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0"]


def inv(*args: str) -> Invocation:
    return resolve(parse(list(args)))


Check = Callable[[Invocation], bool]

# Every upstream flag (cmd/kube-proxy/app/options.go and component-base's logging flags), given
# with upstream's syntax, and what it must change. Flags with no effect here are accepted, and
# their effect is the start-up warning (see test_unused_flags_are_warned).
TABLE: dict[str, tuple[list[str], Check]] = {
    "config": (["--config=CONFIG"], lambda i: i.config_file.endswith("config.conf") and i.cfg.mode == "nftables"),
    "write-config-to": (["--write-config-to=/tmp/out.yaml"], lambda i: i.write_config_to == "/tmp/out.yaml"),
    "cleanup": (["--cleanup"], lambda i: i.cleanup),
    "init-only": (["--init-only=true"], lambda i: i.init_only),
    "feature-gates": (["--feature-gates=KubeProxyIPVS=false"],
                      lambda i: i.cfg.feature_gates == {"KubeProxyIPVS": False}),
    "kubeconfig": (["--kubeconfig", "/etc/kp.conf"], lambda i: i.cfg.kubeconfig == "/etc/kp.conf"),
    "master": (["--master=https://10.0.0.1:6443"], lambda i: i.master == "https://10.0.0.1:6443"),
    "kube-api-content-type": (["--kube-api-content-type=application/json"],
                              lambda i: i.cfg.client_content_type == "application/json"),
    "kube-api-burst": (["--kube-api-burst=20"], lambda i: i.cfg.client_burst == 20),
    "kube-api-qps": (["--kube-api-qps=7.5"], lambda i: i.cfg.client_qps == 7.5),
    "hostname-override": (["--hostname-override", " Node-7 "], lambda i: i.cfg.hostname_override == "node-7"),
    "bind-address": (["--bind-address=192.168.0.7"],
                     lambda i: i.cfg.bind_address == "192.168.0.7" and i.cfg.node_ip == "192.168.0.7"),
    "healthz-bind-address": (["--healthz-bind-address=127.0.0.1:1234"],
                             lambda i: i.cfg.healthz_bind_address == "127.0.0.1:1234"),
    "metrics-bind-address": (["--metrics-bind-address="], lambda i: i.cfg.metrics_bind_address == ""),
    "bind-address-hard-fail": (["--bind-address-hard-fail"], lambda i: i.cfg.bind_address_hard_fail),
    "profiling": (["--profiling=true"], lambda i: i.cfg.enable_profiling),
    "show-hidden-metrics-for-version": (["--show-hidden-metrics-for-version=1.33"],
                                        lambda i: i.cfg.show_hidden_metrics_for_version == "1.33"),
    "proxy-mode": (["--proxy-mode=nftables"], lambda i: i.cfg.mode == "nftables"),
    "iptables-masquerade-bit": (["--iptables-masquerade-bit=12"], lambda i: i.cfg.masquerade_mark() == "0x00001000"),
    "masquerade-all": (["--masquerade-all=true"], lambda i: i.cfg.masquerade_all),
    "iptables-localhost-nodeports": (["--iptables-localhost-nodeports=false"], lambda i: not i.cfg.localhost_nodeports),
    "iptables-sync-period": (["--iptables-sync-period=1m30s"], lambda i: i.cfg.sync_period == 90),
    "iptables-min-sync-period": (["--iptables-min-sync-period=0"], lambda i: i.cfg.min_sync_period == 0),
    "ipvs-sync-period": (["--ipvs-sync-period=5s"], lambda i: i.cfg.ipvs["syncPeriod"] == 5 and i.cfg.sync_period == 30),
    "ipvs-min-sync-period": (["--ipvs-min-sync-period=2s"], lambda i: i.cfg.ipvs["minSyncPeriod"] == 2),
    "ipvs-scheduler": (["--ipvs-scheduler=wrr"], lambda i: i.cfg.ipvs["scheduler"] == "wrr"),
    "ipvs-exclude-cidrs": (["--ipvs-exclude-cidrs=10.0.0.0/8,192.168.0.0/16"],
                           lambda i: i.cfg.ipvs["excludeCIDRs"] == ["10.0.0.0/8", "192.168.0.0/16"]),
    "ipvs-strict-arp": (["--ipvs-strict-arp"], lambda i: i.cfg.ipvs["strictARP"] is True),
    "ipvs-tcp-timeout": (["--ipvs-tcp-timeout=1h"], lambda i: i.cfg.ipvs["tcpTimeout"] == 3600),
    "ipvs-tcpfin-timeout": (["--ipvs-tcpfin-timeout=30s"], lambda i: i.cfg.ipvs["tcpFinTimeout"] == 30),
    "ipvs-udp-timeout": (["--ipvs-udp-timeout=300ms"], lambda i: i.cfg.ipvs["udpTimeout"] == 0.3),
    "detect-local-mode": (["--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=veth"],
                          lambda i: i.cfg.detect_local_mode == "InterfaceNamePrefix"),
    "pod-bridge-interface": (["--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cni0"],
                             lambda i: i.cfg.bridge_interface == "cni0"),
    "pod-interface-name-prefix": (["--pod-interface-name-prefix=veth"], lambda i: i.cfg.interface_name_prefix == "veth"),
    "cluster-cidr": (["--cluster-cidr=10.244.0.0/16,fd00:10:244::/48"],
                     lambda i: i.cfg.cluster_cidr == ("10.244.0.0/16", "fd00:10:244::/48")),
    "nodeport-addresses": (["--nodeport-addresses=primary"], lambda i: i.cfg.nodeport_addresses == ("primary",)),
    "oom-score-adj": (["--oom-score-adj=500"], lambda i: i.cfg.oom_score_adj == 500),
    "conntrack-max-per-core": (["--conntrack-max-per-core=0"], lambda i: i.cfg.conntrack.max_per_core == 0),
    "conntrack-min": (["--conntrack-min=1000"], lambda i: i.cfg.conntrack.min == 1000),
    "conntrack-tcp-timeout-established": (["--conntrack-tcp-timeout-established=2h"],
                                          lambda i: i.cfg.conntrack.tcp_established_timeout == 7200),
    "conntrack-tcp-timeout-close-wait": (["--conntrack-tcp-timeout-close-wait=90s"],
                                         lambda i: i.cfg.conntrack.tcp_close_wait_timeout == 90),
    "conntrack-tcp-be-liberal": (["--conntrack-tcp-be-liberal"], lambda i: i.cfg.conntrack.tcp_be_liberal),
    "conntrack-udp-timeout": (["--conntrack-udp-timeout=30s"], lambda i: i.cfg.conntrack.udp_timeout == 30),
    "conntrack-udp-timeout-stream": (["--conntrack-udp-timeout-stream=2m"],
                                     lambda i: i.cfg.conntrack.udp_stream_timeout == 120),
    "config-sync-period": (["--config-sync-period=1h"], lambda i: i.cfg.config_sync_period == 3600),
    "healthz-port": (["--healthz-bind-address=127.0.0.1", "--healthz-port=12345"],
                     lambda i: i.cfg.healthz_bind_address == "127.0.0.1:12345"),
    "metrics-port": (["--metrics-port=0"], lambda i: i.cfg.metrics_bind_address == ""),
    "v": (["--v=4"], lambda i: i.cfg.verbosity == 4),
    "vmodule": (["--vmodule=proxier*=5"], lambda i: True),
    "logging-format": (["--logging-format=json"], lambda i: i.cfg.logging_format == "json"),
    "log-flush-frequency": (["--log-flush-frequency=5s"], lambda i: True),
    # Upstream refuses the alpha logging options unless their gate is on.
    "log-json-info-buffer-size": (["--log-json-info-buffer-size=1Mi", "--feature-gates=LoggingAlphaOptions=true"],
                                  lambda i: i.cfg.logging_extra["options"]["json"]["infoBufferSize"] == "1Mi"),
    "log-json-split-stream": (["--log-json-split-stream", "--feature-gates=LoggingAlphaOptions=true"],
                              lambda i: i.cfg.logging_extra["options"]["json"]["splitStream"] is True),
    "log-text-info-buffer-size": (["--log-text-info-buffer-size=0"], lambda i: True),
    "log-text-split-stream": (["--log-text-split-stream=false"], lambda i: True),
    "version": (["--version"], lambda i: i.version),
    "help": (["-h"], lambda i: i.help),
}


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cfg") / "config.conf"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\n"
        "clusterCIDR: 10.244.0.0/16\nhostnameOverride: from-file\nlogging:\n  verbosity: 1\n  format: text\n"
        "nftables:\n  masqueradeAll: true\n"
    )
    return path


def test_the_table_covers_every_upstream_flag() -> None:
    upstream = {f.name for f in FLAGS if not f.ours}
    assert set(TABLE) == upstream


@pytest.mark.parametrize("name", sorted(TABLE))
def test_each_upstream_flag_has_its_effect(name: str, config_file: Path) -> None:
    args, check = TABLE[name]
    args = [a.replace("CONFIG", str(config_file)) for a in args]
    resolved = inv(*args)
    assert check(resolved), (args, resolved)
    # `--flag value` is `--flag=value` (booleans take no separate value in pflag).
    spaced: list[str] = []
    for arg in args:
        name_part, eq, value = arg.partition("=")
        flag = flags.BY_NAME.get(name_part.lstrip("-"))
        spaced += [name_part, value] if eq and flag is not None and flag.kind != "bool" else [arg]
    assert inv(*spaced) == resolved


@pytest.mark.parametrize("spelling", ["1", "t", "T", "TRUE", "true", "True"])
def test_go_booleans(spelling: str) -> None:
    assert inv(f"--masquerade-all={spelling}").cfg.masquerade_all
    false = {"1": "0", "t": "f", "T": "F", "TRUE": "FALSE", "true": "false", "True": "False"}[spelling]
    assert not inv("--masquerade-all", f"--masquerade-all={false}").cfg.masquerade_all


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--masquerade-all=yes"], 'invalid argument "yes" for "--masquerade-all" flag: strconv.ParseBool'),
        (["--masquerade-all", "false"], '"kube-proxy" does not take any arguments'),
        (["--iptables-sync-period=30"], 'invalid argument "30" for "--iptables-sync-period" flag: time: missing unit'),
        (["--kube-api-burst=x"], 'invalid argument "x" for "--kube-api-burst" flag'),
        (["--bind-address=300.1.1.1"], "is not a valid IP address"),
        (["--proxy-modes=iptables"], "unknown flag: --proxy-modes"),
        (["-x"], "unknown shorthand flag: 'x' in -x"),
        (["--config"], "flag needs an argument: --config"),
        (["--feature-gates=A"], "missing bool value for A"),
    ],
)
def test_pflag_errors_name_the_flag(args: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=re.escape(message)):
        inv(*args)


def test_verbosity_anywhere_in_every_spelling() -> None:
    for args in (["-v", "3"], ["-v=3"], ["-v3"], ["--v=3"], ["--v", "3"], ["--masquerade-all", "-v", "3"]):
        assert inv(*args).cfg.verbosity == 3, args


def test_underscores_lists_and_maps_add_up() -> None:
    cfg = inv("--cluster_cidr=10.0.0.0/8", "--nodeport-addresses=10.0.0.0/8", "--nodeport-addresses", "fd00::/64",
              "--feature-gates=ContextualLogging=false", "--feature-gates=NFTablesNetlink=T").cfg
    assert cfg.cluster_cidr == ("10.0.0.0/8",) and cfg.nodeport_addresses == ("10.0.0.0/8", "fd00::/64")
    assert cfg.feature_gates == {"ContextualLogging": False, "NFTablesNetlink": True}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0), ("1s", 1), ("1m30s", 90), ("1.5h", 5400), ("300ms", 0.3), ("2h22m", 8520), ("-1s", -1), ("1h0m0s", 3600)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


def test_with_config_only_upstreams_exceptions_apply(config_file: Path) -> None:
    """Upstream's Options.Complete: the file replaces the flags' configuration, except
    --hostname-override and the logging flags (copyLogsFromFlags); --master, --cleanup, ... are
    not configuration and apply too."""
    resolved = inv(f"--config={config_file}", "--masquerade-all=false", "--proxy-mode=iptables", "--cluster-cidr=10.0.0.0/8",
                   "--hostname-override=node-9", "-v=5", "--master=http://127.0.0.1:1", "--kubeconfig=/x")
    cfg = resolved.cfg
    assert (cfg.mode, cfg.masquerade_all, cfg.cluster_cidr) == ("nftables", True, ("10.244.0.0/16",))
    assert (cfg.hostname_override, cfg.verbosity, cfg.kubeconfig) == ("node-9", 5, "")
    assert resolved.master == "http://127.0.0.1:1"
    ignored = sorted(re.findall(r"^--([\w-]+) is ignored because --config is given", w)[0] for w in resolved.warnings)
    assert ignored == ["cluster-cidr", "kubeconfig", "masquerade-all", "proxy-mode"]
    # Without the override flag the file's hostnameOverride stands.
    assert inv(f"--config={config_file}").cfg.hostname_override == "from-file"


def test_every_non_config_flag_is_ignored_with_config(config_file: Path) -> None:
    base = inv(f"--config={config_file}").cfg
    for name, (args, _) in TABLE.items():
        flag = flags.BY_NAME[name]
        if flag.with_config:
            continue
        resolved = inv(f"--config={config_file}", *args)
        assert resolved.cfg == base, name
        assert any(w.startswith(f"--{name} is ignored") for w in resolved.warnings), name


def test_ipvs_is_accepted_and_windows_mode_refused_by_name(tmp_path: Path) -> None:
    assert inv("--proxy-mode=ipvs").cfg.mode == "ipvs"
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n")
    assert inv(f"--config={path}").cfg.mode == "ipvs"
    with pytest.raises(ConfigError, match="kernelspace is upstream's Windows mode"):
        inv("--proxy-mode=kernelspace")


def test_feature_gates_as_upstream() -> None:
    with pytest.raises(ConfigError, match="unrecognized feature gate: NoSuchGate"):
        inv("--feature-gates=NoSuchGate=true")
    with pytest.raises(ConfigError, match="cannot set feature gate NFTablesProxyMode to false, feature is locked"):
        inv("--feature-gates=NFTablesProxyMode=false")
    assert inv("--feature-gates=NFTablesProxyMode=true").cfg.feature_gates == {"NFTablesProxyMode": True}
    with pytest.raises(ConfigError, match="unrecognized feature gate: LoadBalancerIPMode"):
        inv("--feature-gates=LoadBalancerIPMode=true")  # GA gate no longer in the v1.37.2 registry


def test_upstream_validation_messages_name_the_field() -> None:
    for args, message in (
        (["--oom-score-adj=1001"], "--oom-score-adj (oomScoreAdj): 1001 must be within [-1000, 1000]"),
        (["--logging-format=xml"], "--logging-format (logging.format): unsupported value 'xml'"),
        (["--iptables-sync-period=0s"], "--iptables-sync-period (iptables.syncPeriod): 0s: must be greater than 0"),
        (["--nodeport-addresses=primary,primary"], '--nodeport-addresses (nodePortAddresses[1]): Duplicate value: "primary"'),
        (["--show-hidden-metrics-for-version=latest"], "must be <major>.<minor>"),
        (["--hostname-override= "], "empty hostname-override is invalid"),
    ):
        with pytest.raises(ConfigError, match=re.escape(message)):
            inv(*args)


def test_write_config_to_round_trips(tmp_path: Path, config_file: Path) -> None:
    out = tmp_path / "written.yaml"
    args = ["--config", str(config_file), "--hostname-override=node-3", "--write-config-to", str(out)]
    proc = subprocess.run([str(KUBE_PROXY), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    written = yaml.safe_load(out.read_text())
    assert (written["kind"], written["mode"], written["hostnameOverride"]) == ("KubeProxyConfiguration", "nftables", "node-3")
    assert written["conntrack"]["tcpEstablishedTimeout"] == "24h0m0s" and written["oomScoreAdj"] == -999
    # Read back, it is the same configuration (the same file: defaults are written out in full).
    assert to_kube_proxy_configuration(load_config_file(out)) == to_kube_proxy_configuration(inv(*args).cfg)
    # Without --config: the flags' effective configuration, upstream's defaults included.
    flagged = tmp_path / "flagged.yaml"
    subprocess.run([str(KUBE_PROXY), "--masquerade-all", "--iptables-sync-period=1m", f"--write-config-to={flagged}"],
                   check=True, capture_output=True, timeout=60)
    cfg = load_config_file(flagged)
    assert cfg.masquerade_all and cfg.sync_period == 60
    flagged_cfg = inv("--masquerade-all", "--iptables-sync-period=1m").cfg
    assert to_kube_proxy_configuration(cfg) == to_kube_proxy_configuration(flagged_cfg)


def test_kubeadm_configmap_passed_as_config_says_so(tmp_path: Path) -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "kubeadm" / "kube-proxy.yaml").read_text()))
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(docs[0]))
    with pytest.raises(ConfigError) as err:
        inv(f"--config={path}")
    text = str(err.value)
    assert "this is a ConfigMap (kube-system/kube-proxy" in text and "its 'config.conf' key" in text


def test_unused_flags_are_warned() -> None:
    from kubeproxy.proxy.startup import config_warnings

    cfg = inv("--profiling", "--config-sync-period=1h", "--show-hidden-metrics-for-version=1.32",
              "--ipvs-scheduler=wrr", "--nodeport-addresses=primary").cfg
    text = "\n".join(config_warnings(cfg))
    for name in ("enableProfiling", "configSyncPeriod", "showHiddenMetricsForVersion", "ipvs.scheduler"):
        assert name in text, name
    assert config_warnings(inv("--nodeport-addresses=primary").cfg) == []
    assert config_warnings(inv("--kube-api-qps=50", "--kube-api-burst=100", "--nodeport-addresses=primary").cfg) == []


def test_console_script_and_run_share_the_command_line() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kube-proxy"] == "kubeproxy.cli:kube_proxy"
    upstream = subprocess.run([str(KUBE_PROXY), "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    ours = subprocess.run([str(BIN / "kubeproxy"), "run", "--help"], capture_output=True, text=True, timeout=60,
                          check=True).stdout
    listed = re.findall(r"--([\w-]+)", upstream)
    # Deprecated flags are accepted but hidden, as pflag hides them.
    shown = {name for name in TABLE if not flags.BY_NAME[name].deprecated} - {"v", "help"}
    assert shown <= set(listed) and ours.replace("kubeproxy run", "kube-proxy") == upstream
    bad = subprocess.run([str(BIN / "kubeproxy"), "run", "--masquerade-all=maybe"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and 'invalid argument "maybe" for "--masquerade-all" flag' in bad.stderr


def test_bind_address_hard_fail_exits_when_the_port_is_taken(tmp_path: Path) -> None:
    (tmp_path / "demo.yaml").write_text(DEMO.read_text())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        args = [str(KUBE_PROXY), "--manifests", str(tmp_path), "--hostname-override=node-1", *NO_SYSCTLS,
                "--oom-score-adj=0", f"--healthz-bind-address={address}", "--metrics-bind-address="]
        proc = subprocess.run([*args, "--bind-address-hard-fail"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1, proc.stderr
        assert f'"failed to start healthz server" address="{address}"' in proc.stderr and "in use" in proc.stderr


def test_oom_score_adj_is_applied_to_the_process() -> None:
    # The start-up path of `kube-proxy --init-only` in a child, which then reads its own score.
    code = (
        "import sys; from kubeproxy.proxy import kube_proxy\n"
        f"rc = kube_proxy.main(['--init-only', '--oom-score-adj=567', *{NO_SYSCTLS!r}])\n"
        "print(rc, open('/proc/self/oom_score_adj').read().strip())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["0", "567"], proc.stderr


def _lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_klog_text_format(tmp_path: Path) -> None:
    proc = subprocess.run([str(KUBE_PROXY), "--write-config-to", str(tmp_path / "o.yaml"), "-v", "2"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    klog = re.compile(r"([IWEF])(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6}) +(\d+) ([\w.]+):(\d+)\] (.*)")
    lines = _lines(proc.stderr)
    assert lines
    for line in lines:
        m = klog.fullmatch(line)
        assert m, line
        assert len(line.split("]")[0].split()[2]) <= 7  # the pid, right-aligned in 7 columns
    wrote = [line for line in lines if '"Wrote configuration"' in line]
    assert wrote and wrote[0].startswith("I") and wrote[0].endswith(f'] "Wrote configuration" file="{tmp_path / "o.yaml"}"')


def test_json_logging_format(tmp_path: Path, config_file: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(config_file.read_text().replace("format: text", "format: json"))
    proc = subprocess.run([str(KUBE_PROXY), f"--config={path}", "--masquerade-all", "--write-config-to",
                           str(tmp_path / "o.yaml")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in _lines(proc.stderr)]
    assert records
    for record in records:
        assert isinstance(record["ts"], float) and re.fullmatch(r"[\w/]+\.py:\d+", record["caller"]) and record["msg"]
    wrote = [r for r in records if r["msg"] == "Wrote configuration"]
    assert wrote and wrote[0]["file"] == str(tmp_path / "o.yaml") and wrote[0]["v"] == 0
    assert any(r["msg"].startswith("--masquerade-all is ignored") for r in records)
    # The -v flag beats the file's logging.verbosity (upstream's copyLogsFromFlags).
    assert inv(f"--config={path}", "-v", "0").cfg.verbosity == 0 and inv(f"--config={path}").cfg.verbosity == 1


def test_run_and_render_warn_about_the_node(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kubeproxy.cli import main

    two = tmp_path / "two-nodes.yaml"
    two.write_text(DEMO.read_text() + "\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: node-2\n")
    result = CliRunner().invoke(main, ["render", "--manifests", str(two)])
    assert result.exit_code == 0
    assert "and no --hostname-override: using this machine's hostname" in result.stderr
    missing = CliRunner().invoke(main, ["render", "--manifests", str(two), "--hostname-override", "nowhere"])
    assert "Node 'nowhere' (--hostname-override) is not among the Nodes given" in missing.stderr
    assert "Can't determine this node's IP, assuming loopback" in missing.stderr
    assert "no cluster CIDR specified for primary IP family" in missing.stderr
    fine = CliRunner().invoke(main, ["render", "--manifests", str(DEMO), "--hostname-override", "node-1",
                                     "--cluster-cidr", "10.244.0.0/16"])
    assert "warning" not in fine.stderr, fine.stderr


def test_env_is_not_needed_for_help() -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    proc = subprocess.run([str(KUBE_PROXY), "-h"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and "--hostname-override" in proc.stdout


def test_help_fits_80_columns_and_demo_takes_the_node() -> None:
    text = subprocess.run([str(KUBE_PROXY), "--help"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert max(len(line) for line in text.splitlines()) <= 80
    from click.testing import CliRunner

    from kubeproxy.cli import main

    demo = CliRunner().invoke(main, ["demo", "--offline", "--hostname-override", "node-3", "--cluster-cidr", "10.244.0.0/16"])
    assert demo.exit_code == 0 and "kubeproxy demo: node node-3" in demo.stdout
    assert "Node 'node-3' (--hostname-override) is not among the Nodes given" in demo.stderr


def test_structured_values_print_as_klog_and_json_do() -> None:
    import io
    import logging

    from kubeproxy.runtime import logs

    message = logs.kv("Syncing iptables rules", full=True, services=5, err="exit 1: x")
    assert message == '"Syncing iptables rules" full=true services=5 err="exit 1: x"'
    stream = io.StringIO()
    logs.setup(2, "json", stream)
    try:
        logging.getLogger("kubeproxy.proxy").error(message)
        logging.getLogger("kubeproxy.proxy").info(logs.kv("SyncProxyRules complete", elapsed="4.1ms"))
        logging.getLogger("kubeproxy.proxy").debug("not at -v 2")
    finally:
        logs.setup(0, "text")
    error, info = (json.loads(line) for line in stream.getvalue().splitlines())
    assert error["msg"] == "Syncing iptables rules" and error["full"] is True and error["services"] == 5 and "v" not in error
    assert (info["msg"], info["elapsed"], info["v"]) == ("SyncProxyRules complete", "4.1ms", 2)


@pytest.mark.parametrize("args", [["--version"], ["--no-such-flag"], ["--help"]])
def test_the_proxy_commands_leave_the_collector_as_they_found_it(args: list[str]) -> None:
    """`kubeproxy run` and `kube-proxy` turn the cyclic collector off before importing the proxy
    (start-up speed); a run that ends before the proxy serves (help, version, a bad flag) turns
    it back on, and it is off meanwhile."""
    import gc

    from click.testing import CliRunner

    from kubeproxy import cli
    from kubeproxy.proxy import kube_proxy

    seen: list[bool] = []
    real = kube_proxy.main

    def spy(argv: list[str], **kwargs: object) -> int:
        seen.append(gc.isenabled())
        return real(argv, **kwargs)  # type: ignore[arg-type]

    assert gc.isenabled()
    try:
        kube_proxy.main = spy  # type: ignore[assignment]
        CliRunner().invoke(cli.main, ["run", *args])
        assert gc.isenabled()
        with pytest.raises(SystemExit):
            cli.kube_proxy(args)
        assert gc.isenabled()
    finally:
        kube_proxy.main = real
    assert seen == [False, False]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--iptables-min-sync-period=60s", "--iptables-sync-period=30s"],
         "--iptables-sync-period (iptables.syncPeriod): 30s: must be greater than or equal to "
         "--iptables-min-sync-period (iptables.minSyncPeriod), 1m0s"),
        (["--iptables-sync-period=1ns"], "--iptables-sync-period (iptables.syncPeriod): 1ns: must be greater than or equal to"),
        (["--iptables-sync-period=-1m"], "--iptables-sync-period (iptables.syncPeriod): -1m0s: must be greater than 0"),
        (["--iptables-min-sync-period=-1s"],
         "--iptables-min-sync-period (iptables.minSyncPeriod): -1s: must be greater than or equal to 0"),
        (["--proxy-mode=nftables", "--iptables-min-sync-period=31s"], "--iptables-sync-period (nftables.syncPeriod): 30s"),
        (["--ipvs-min-sync-period=2m", "--ipvs-sync-period=1m", "--proxy-mode=ipvs"],
         "--ipvs-sync-period (ipvs.syncPeriod): 1m0s: must be greater than or equal to "
         "--ipvs-min-sync-period (ipvs.minSyncPeriod), 2m0s"),
        (["--proxy-mode=ipvs", "--ipvs-sync-period=0s"], "--ipvs-sync-period (ipvs.syncPeriod): 0s: must be greater than 0"),
    ],
)  # fmt: skip
def test_sync_periods_are_validated_as_upstream_naming_the_flag(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        inv(*args)
    assert str(caught.value).startswith(message)


def test_sync_periods_upstream_accepts() -> None:
    assert (inv("--iptables-sync-period=1ns", "--iptables-min-sync-period=0").cfg.sync_period) == 1e-9
    assert inv("--iptables-sync-period=1s", "--iptables-min-sync-period=1s").cfg.min_sync_period == 1.0
    # The ipvs flags set the periods in ipvs mode only, the iptables ones in every other mode.
    ipvs = inv("--proxy-mode=ipvs", "--ipvs-sync-period=45s", "--ipvs-min-sync-period=5s", "--iptables-sync-period=1h").cfg
    assert (ipvs.sync_period, ipvs.min_sync_period) == (45.0, 5.0)
    iptables = inv("--ipvs-sync-period=45s", "--iptables-sync-period=1h").cfg
    assert iptables.sync_period == 3600.0


def test_non_ascii_digits_are_refused_by_the_flag() -> None:
    message = 'invalid argument "\u0661\u0660s" for "--iptables-sync-period" flag: time: invalid duration'
    with pytest.raises(FlagError, match=re.escape(message)):
        inv("--iptables-sync-period=\u0661\u0660s")

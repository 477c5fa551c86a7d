"""`--write-config-to` against what upstream's kube-proxy v1.37.2 writes for the same command line
(tests/fixtures/upstream_operator/README.md), and the written file read back by ours and by upstream."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import pytest

from kubeproxy.proxy import goyaml
from kubeproxy.proxy.config import load_config_file, to_kube_proxy_configuration
from kubeproxy.proxy.kube_proxy import main
from tests.paths import TESTS

FIXTURES = TESTS / "fixtures" / "upstream_operator"
UPSTREAM = Path("/var/cache/kubeproxy-upstream/v1.37.2/bin/kube-proxy")

CASES = {
    "write_config_default.yaml": [],
    "write_config_nftables.yaml": ["--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16", "--nodeport-addresses=primary",
                                   "-v=2", "--feature-gates=KubeProxyIPVS=false,ComponentFlagz=false"],
    "write_config_ipvs.yaml": ["--proxy-mode=ipvs", "--ipvs-scheduler=rr", "--ipvs-exclude-cidrs=10.0.0.0/8",
                               "--iptables-localhost-nodeports=false", "--logging-format=json",
                               "--nodeport-addresses=10.0.0.0/8,primary", "--hostname-override=node-a",
                               "--conntrack-udp-timeout=30s", "--masquerade-all", "--iptables-sync-period=10s",
                               "--ipvs-sync-period=20s"],
    "write_config_logging_flags.yaml": ["--vmodule=a=2,b*=3", "--log-flush-frequency=1s",
                                        "--feature-gates=LoggingAlphaOptions=true", "--log-json-info-buffer-size=1Mi",
                                        "--log-text-split-stream", "--log-text-info-buffer-size=512"],
    "write_config_logging_file.yaml": [f"--config={FIXTURES / 'logging_file_input.yaml'}"],
    "write_config_nftables_file.yaml": [f"--config={FIXTURES / 'nftables_file_input.yaml'}"],
    "write_config_nftables_periods.yaml": ["--proxy-mode=nftables", "--iptables-sync-period=10s",
                                           "--iptables-min-sync-period=2s", "--masquerade-all",
                                           "--iptables-masquerade-bit=10"],
}  # fmt: skip


def _written(args: list[str], tmp_path: Path) -> str:
    out = tmp_path / "written.yaml"
    assert main([*args, f"--write-config-to={out}"], stdout=io.StringIO()) == 0
    return out.read_text()


@pytest.mark.parametrize("fixture", CASES)
def test_written_file_is_upstreams_byte_for_byte(fixture: str, tmp_path: Path) -> None:
    assert _written(CASES[fixture], tmp_path) == (FIXTURES / fixture).read_text()


@pytest.mark.parametrize("fixture", CASES)
def test_upstreams_file_reads_back_to_the_same_file(fixture: str) -> None:
    cfg = load_config_file(FIXTURES / fixture)
    assert goyaml.dump(to_kube_proxy_configuration(cfg)) == (FIXTURES / fixture).read_text()


def test_top_level_periods_are_not_written_and_the_mode_section_has_them() -> None:
    cfg = load_config_file(FIXTURES / "write_config_nftables.yaml")
    doc = to_kube_proxy_configuration(cfg)
    assert "syncPeriod" not in doc and "minSyncPeriod" not in doc
    assert doc["nftables"]["syncPeriod"] == "30s" and doc["iptables"]["syncPeriod"] == "0s"


def test_nftables_mode_marks_with_the_nftables_sections_bit() -> None:
    """Upstream's nftables proxier logs mark="0x00004000" with --iptables-masquerade-bit=10 (README)."""
    from kubeproxy.proxy import flags

    cfg = flags.resolve(flags.parse(["--proxy-mode=nftables", "--iptables-masquerade-bit=10"])).cfg
    assert cfg.masquerade_mark() == "0x00004000"
    cfg = flags.resolve(flags.parse(["--proxy-mode=iptables", "--iptables-masquerade-bit=10"])).cfg
    assert cfg.masquerade_mark() == "0x00000400"
    from_file = load_config_file(FIXTURES / "nftables_file_input.yaml")
    assert (from_file.masquerade_bit, from_file.localhost_nodeports) == (12, False)


def test_localhost_nodeports_is_written_as_given_in_every_mode(tmp_path: Path) -> None:
    for mode in ("iptables", "nftables", "ipvs"):
        text = _written([f"--proxy-mode={mode}", "--iptables-localhost-nodeports=false"], tmp_path)
        assert "  localhostNodePorts: false\n" in text


def test_userspace_fields_only_in_userspace_mode(tmp_path: Path) -> None:
    """udpIdleTimeout is not a v1alpha1 field: written only in userspace mode, whose files upstream
    refuses for the mode anyway; every other file stays strictly decodable."""
    assert "udpIdleTimeout" not in _written(["--udp-timeout=1s"], tmp_path)
    assert "udpIdleTimeout: 1s" in _written(["--proxy-mode=userspace", "--udp-timeout=1s"], tmp_path)


def test_go_yaml_quotes_with_double_quotes() -> None:
    assert goyaml.dump({"b": "", "a": "0", "c": ["x"], "d": None}) == 'a: "0"\nb: ""\nc:\n- x\nd: null\n'


@pytest.mark.skipif(not UPSTREAM.exists(), reason="upstream's kube-proxy binary is not built here")
@pytest.mark.parametrize("args", [[], ["--proxy-mode=nftables", "--cluster-cidr=10.244.0.0/16", "-v=3"],
                                  ["--proxy-mode=ipvs", "--ipvs-scheduler=rr", "--vmodule=a=2"]])  # fmt: skip
def test_upstream_loads_our_file_strictly_and_writes_it_back_unchanged(args: list[str], tmp_path: Path) -> None:
    ours = tmp_path / "ours.yaml"
    ours.write_text(_written(args, tmp_path))
    back = tmp_path / "back.yaml"
    done = subprocess.run([str(UPSTREAM), f"--config={ours}", f"--write-config-to={back}"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "lenient decoding" not in done.stderr
    assert back.read_text() == ours.read_text()



@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--log-text-split-stream", "--log-json-info-buffer-size=1Mi"],
         "initialize logging: [logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled, "
         "logging.options.json.infoBufferSize: Forbidden: Feature LoggingAlphaOptions is disabled]"),
        (["--logging-format=json", "--vmodule=a=2"],
         "initialize logging: logging.vmodule: Forbidden: Only supported for text log format"),
    ],
)  # fmt: skip
def test_logging_options_are_refused_as_upstream_refuses_them(args: list[str], message: str) -> None:
    """Upstream v1.37.2's own messages for these command lines (its `command failed` error)."""
    from kubeproxy.model.proxy_config import ConfigError
    from kubeproxy.proxy import flags

    with pytest.raises(ConfigError) as caught:
        flags.resolve(flags.parse(args))
    assert str(caught.value) == message


@pytest.mark.parametrize("args", [["--log-text-split-stream", "--feature-gates=LoggingAlphaOptions=true"],
                                  ["--vmodule=a=2", "--log-text-split-stream=false"]])  # fmt: skip
def test_logging_options_upstream_accepts(args: list[str]) -> None:
    from kubeproxy.proxy import flags

    assert flags.resolve(flags.parse(args)).cfg.logging_extra


@pytest.mark.parametrize(("section", "field"), [("tcpTimeout: abc", "ipvs.tcpTimeout"), ("excludeCIDRs: 7", "ipvs.excludeCIDRs"),
                                                ("strictARP: maybe", "ipvs.strictARP")])  # fmt: skip
def test_ipvs_section_of_the_wrong_type_is_refused_in_every_mode(section: str, field: str, tmp_path: Path) -> None:
    """Upstream's decoding refuses it whatever the mode (`failed to decode: time: invalid duration "abc"`):
    so do we, naming the field, before anything is written."""
    from kubeproxy.model.proxy_config import ConfigError

    path = tmp_path / "config.yaml"
    path.write_text(f"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nipvs:\n  {section}\n")
    with pytest.raises(ConfigError, match=f"^--config {path}: {field}: "):
        load_config_file(path)

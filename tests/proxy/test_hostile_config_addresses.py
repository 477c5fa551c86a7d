"""Addresses from flags and the config file pass the same gate as object addresses: no zone, no
rule text, upstream's sloppy parse (ParseIPSloppy / ParseCIDRSloppy), canonical text out."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.model.proxy_config import ConfigError, ProxyConfig
from kubeproxy.proxy.config import load_config_file, validate
from kubeproxy.proxy.flags import FlagError, parse, resolve

INJECTION = "fd00::2%1\n-I INPUT 1 -j DROP"


@pytest.mark.parametrize(
    "args",
    [
        [f"--node-ip={INJECTION}"],
        [f"--node-ip=10.0.0.1,{INJECTION}"],
        [f"--bind-address={INJECTION}"],
        ["--bind-address=fe80::1%eth0"],
        [f"--cluster-cidr={INJECTION}/64"],
        ["--cluster-cidr=fd00::%1/64"],
        [f"--healthz-bind-address=[{INJECTION}]:10256"],
        [f"--metrics-bind-address=[{INJECTION}]:10249"],
    ],
)
def test_a_zone_or_rule_text_in_an_address_flag_is_refused_naming_the_flag(args: list[str]) -> None:
    with pytest.raises((FlagError, ConfigError)) as caught:
        resolve(parse(args))
    flag = args[0].split("=", 1)[0]
    assert flag in str(caught.value)
    assert "\n" not in str(caught.value).split(":", 1)[0]


def test_a_zone_in_the_config_files_addresses_is_refused(tmp_path: Path) -> None:
    for field, value in [("clusterCIDR", "fd00::%1/64"), ("bindAddress", "fe80::1%eth0")]:
        path = tmp_path / f"{field}.yaml"
        path.write_text(f"apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n{field}: '{value}'\n")
        with pytest.raises(ConfigError):
            validate(load_config_file(path))


def test_ipvs_exclude_cidrs_refuse_a_zone(tmp_path: Path) -> None:
    path = tmp_path / "ipvs.yaml"
    path.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n"
        "ipvs:\n  excludeCIDRs: ['fd00::%1/64']\n"
    )
    with pytest.raises(ConfigError, match="excludeCIDRs"):
        validate(load_config_file(path))


def test_cluster_cidrs_are_read_sloppily_and_kept_canonical() -> None:
    cfg = validate(ProxyConfig(cluster_cidr=("010.244.0.1/16", "fd00:10:244::1/64")))
    assert cfg.cluster_cidr == ("10.244.0.0/16", "fd00:10:244::/64")


def test_node_ips_are_canonical() -> None:
    cfg = resolve(parse(["--node-ip=010.000.000.001,FD00::0001"])).cfg
    assert cfg.node_ip == "10.0.0.1,fd00::1"

"""The userspace mode's flags and file fields (upstream's names from before v1.26)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeproxy.backends import registry
from kubeproxy.backends.iptables.fake import FakeIptables
from kubeproxy.backends.userspace.proxier import UserspaceProxier
from kubeproxy.model.proxy_config import ConfigError, ProxyConfig
from kubeproxy.proxy.config import load_config_file, unused_settings, validate
from kubeproxy.proxy.flags import parse, resolve


def cfg(*args: str) -> ProxyConfig:
    return validate(resolve(parse(list(args))).cfg)


def test_flags_reach_the_backend() -> None:
    c = cfg("--proxy-mode", "userspace", "--proxy-port-range", "40000-40100", "--udp-timeout", "2s")
    assert (c.mode, c.port_range, c.udp_idle_timeout) == ("userspace", "40000-40100", 2.0)
    backend = registry.create("userspace", run=FakeIptables().run, sync_period=30, cfg=c)  # runs nothing until a sync
    assert isinstance(backend, UserspaceProxier)
    assert (backend.port_range, backend.udp_timeout) == ("40000-40100", 2.0)
    assert cfg().udp_idle_timeout == 0.25  # upstream's default


@pytest.mark.parametrize(("args", "message"), [
    (("--proxy-port-range", "9-1"), "--proxy-port-range"),
    (("--udp-timeout", "0s"), "--udp-timeout"),
])  # fmt: skip
def test_bad_values_are_named(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cfg("--proxy-mode", "userspace", *args)


def test_config_file_fields(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n"
                    "portRange: 30000+99\nudpIdleTimeout: 500ms\n")  # fmt: skip
    c = load_config_file(path)
    assert (c.port_range, c.udp_idle_timeout) == ("30000+99", 0.5)
    assert not [w for w in unused_settings(c) if "portRange" in w or "udpIdleTimeout" in w]


def test_write_config_to_keeps_the_userspace_fields(tmp_path: Path) -> None:
    """--write-config-to writes portRange and udpIdleTimeout, and the file reads back the same."""
    import yaml

    from kubeproxy.proxy.config import to_kube_proxy_configuration

    c = cfg("--proxy-mode", "userspace", "--proxy-port-range", "40000-40100", "--udp-timeout", "250ms")
    doc = to_kube_proxy_configuration(c)
    assert (doc["portRange"], doc["udpIdleTimeout"]) == ("40000-40100", "250ms")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    back = load_config_file(path)
    assert (back.mode, back.port_range, back.udp_idle_timeout) == ("userspace", "40000-40100", 0.25)


def test_proxy_mode_help_lists_every_registered_mode() -> None:
    from kubeproxy.proxy.flags import usage

    text = " ".join(usage().split())
    for mode in registry.MODES:
        assert f"'{mode}'" in text.split("--proxy-mode string", 1)[1].split("--", 1)[0]

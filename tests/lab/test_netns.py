import subprocess

import pytest

from kubeproxy.lab import netns as netns_mod

pytestmark = pytest.mark.root


def test_namespace_is_isolated_and_removed() -> None:
    with netns_mod.netns("kpt") as a, netns_mod.netns("kpt") as b:
        netns_mod.link(a, "eth0", "10.250.0.1/24", b, "eth0", "10.250.0.2/24")
        out = a.run(["ping", "-c", "1", "-W", "2", "10.250.0.2"], check=False)
        assert out.returncode == 0, out.stderr
        name = a.name
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert name not in listed

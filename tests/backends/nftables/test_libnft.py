"""libnftables in-process (backends/libnft.py): the same transactions as `nft -f -`, in the right namespace."""

from __future__ import annotations

import subprocess

import pytest

from kubeproxy.backends.exec import local_run
from kubeproxy.backends.libnft import LibNft, LibNftError, for_runner
from kubeproxy.backends.nftables.fake import FakeNft


def test_a_runner_that_names_no_namespace_keeps_the_nft_process() -> None:
    # The fakes (and any wrapper) must keep receiving the nft calls: no library context for them.
    assert for_runner(FakeNft().run) is None
    assert for_runner(lambda argv, **kw: local_run(argv, **kw)) is None


def test_a_namespace_that_cannot_be_entered_is_an_error_not_the_host(tmp_path) -> None:
    with pytest.raises(LibNftError):
        LibNft.open(str(tmp_path / "no-such-namespace"))


@pytest.mark.root
def test_transactions_land_in_the_namespace_and_errors_come_back(netns) -> None:
    lib = for_runner(netns.run)
    assert lib is not None, "libnftables1 comes with the nftables package scripts/setup installs"
    try:
        assert lib.run_text("add table ip kplibtest\nadd chain ip kplibtest c\n") == (0, "", "")
        rc, _, err = lib.run_text("add rule ip kplibtest nochain accept\n")
        assert rc != 0 and "No such file or directory" in err
        # A dry run (`nft -c`) changes nothing.
        assert lib.run_text("add rule ip kplibtest c drop\n", check=True)[0] == 0
        assert "drop" not in netns.run(["nft", "list", "chain", "ip", "kplibtest", "c"]).stdout
        assert lib.run_text("add rule ip kplibtest c drop\n")[0] == 0
        assert "drop" in netns.run(["nft", "list", "chain", "ip", "kplibtest", "c"]).stdout
        host = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
        assert "kplibtest" not in host  # read-only look at the host: the table went to the namespace only
    finally:
        lib.close()

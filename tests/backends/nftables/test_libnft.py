"""libnftables in-process (kernel/libnft.py): the same transactions as `nft -f -`, in the right namespace."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kubeproxy.backends.nftables.apply import NftApplier
from kubeproxy.backends.nftables.fake import FakeNft
from kubeproxy.backends.nftables.render import render
from kubeproxy.kernel.exec import local_run
from kubeproxy.kernel.libnft import TRIM_AFTER_BYTES, LibNft, LibNftError, for_runner
from kubeproxy.lab.netns import NetNS
from tests.backends.nftables.helpers import endpoint, options, port, service, slice_, view


def test_a_runner_that_names_no_namespace_keeps_the_nft_process() -> None:
    # The fakes (and any wrapper) must keep receiving the nft calls: no library context for them.
    assert for_runner(FakeNft().run) is None
    assert for_runner(lambda argv, **kw: local_run(argv, **kw)) is None


def test_a_namespace_that_cannot_be_entered_is_an_error_not_the_host(tmp_path: Path) -> None:
    with pytest.raises(LibNftError):
        LibNft.open(str(tmp_path / "no-such-namespace"))


@dataclass
class _RecordingLib:
    """Stands for a LibNft: runs each text through the fake, as `nft -f -` would, and keeps its size."""

    fake: FakeNft
    sizes: list[int] = field(default_factory=list)

    def run_text(self, text: str, *, check: bool = False) -> tuple[int, str, str]:
        self.sizes.append(len(text))
        proc = self.fake.run(["nft", *(["-c"] if check else []), "-f", "-"], input=text, check=False)
        return proc.returncode, proc.stdout, proc.stderr


def test_large_transactions_go_to_the_nft_process_and_small_ones_stay_in_process() -> None:
    fake = FakeNft()
    lib = _RecordingLib(fake)
    objects = [service("ns1", f"svc{i}", f"172.30.0.{i + 1}", port("http", 80)) for i in range(20)]
    objects += [
        slice_("ns1", f"svc{i}", [endpoint(f"10.180.{i}.{e + 1}") for e in range(5)], ("http", 80, "TCP")) for i in range(20)
    ]
    applier = NftApplier("ip", fake.run, lib=lib, in_process_max_bytes=2000)  # type: ignore[arg-type]
    cold = render(view(objects), options())
    assert len(cold.text()) > 2000
    assert applier.apply(cold).mode == "create"
    assert lib.sizes == [] and _transactions(fake) > 0  # the process
    runs = _transactions(fake)
    objects[-1] = slice_("ns1", "svc19", [endpoint("10.180.99.1")], ("http", 80, "TCP"))
    changed = render(view(objects), options(), previous=cold, changed_services={("ns1", "svc19")})
    assert applier.apply(changed).mode == "incremental"
    assert len(lib.sizes) == 1 and lib.sizes[0] < 2000  # in process
    assert _transactions(fake) - runs == len(lib.sizes)  # every one since came through the library
    other = FakeNft()
    NftApplier("ip", other.run).apply(render(view(objects), options()))
    assert _contents(fake) == _contents(other)  # both paths reached the same table


def _transactions(fake: FakeNft) -> int:
    """`nft -f -` runs the fake saw, from the process path or through _RecordingLib."""
    return sum(argv[:3] == ["nft", "-f", "-"] for argv in fake.calls)


def _contents(fake: FakeNft) -> Any:
    table = fake.table()
    assert table is not None
    return {n: c.rules for n, c in table.chains.items()}, {n: s.elements for n, s in table.sets.items()}


@pytest.mark.root
def test_transactions_land_in_the_namespace_and_errors_come_back(netns: NetNS) -> None:
    lib = for_runner(netns)
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


@pytest.mark.root
def test_a_large_transaction_hands_its_memory_back_and_a_small_one_does_not_pay(netns: NetNS) -> None:
    lib = for_runner(netns)
    assert lib is not None
    try:
        assert lib.run_text("add table ip kplibtest\nadd set ip kplibtest s { type ipv4_addr ; }\n") == (0, "", "")
        assert lib.trims == 0
        # 90k addresses, over TRIM_AFTER_BYTES of text: as a cold sync's element lines are.
        lines = [
            "add element ip kplibtest s { " + ", ".join(f"10.{i}.{j // 250}.{j % 250 + 1}" for j in range(1000)) + " }"
            for i in range(90)
        ]
        text = "\n".join(lines) + "\n"
        assert len(text.encode()) >= TRIM_AFTER_BYTES
        assert lib.run_text(text) == (0, "", "")
        assert lib.trims == 1
        listed = netns.run(["nft", "-j", "list", "set", "ip", "kplibtest", "s"]).stdout
        assert len(json.loads(listed)["nftables"][1]["set"]["elem"]) == 90_000
    finally:
        lib.close()

"""The memory-light paths of an iptables sync give what the general ones gave.

- `AppliedChains.filter` on a full sync finds the tracked chains with a regex instead of keying
  every line; it must record the same digests as the general path (a later partial sync compares
  its own, general-path digests with them) and fall back to that path for text it does not
  recognise (line breaks other than "\\n", non-ASCII).
- `_with_missing_jump_tables` appends the `-I` lines to the rendered tables' pieces; joined, the
  result must be what the former line-by-line rebuild gave (kept here as the reference).
- `AppliedChains.filter_chunks` of a full sync's pieces records what `filter` of their join does,
  and falls back to it for pieces that are not whole lines.
- The sync report keeps the counts but not the restore text.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kubeproxy.backends.iptables import jumps, last_restore
from kubeproxy.backends.iptables.fake import FakeIptables
from kubeproxy.backends.iptables.last_restore import AppliedChains, Filtered
from kubeproxy.backends.iptables.offline import render_iptables
from kubeproxy.backends.iptables.proxier import IptablesProxier, _rule_args, _rule_spec
from kubeproxy.backends.iptables.render import TableText, render_tables, restore_chunks, restore_text
from kubeproxy.cluster.manifest_load import load
from kubeproxy.model.proxy_config import ProxyConfig
from tests.paths import DEMO

CFG = ProxyConfig(cluster_cidr=("10.244.0.0/16",))


def _demo_text(**kwargs: Any) -> str:
    cfg = ProxyConfig(cluster_cidr=("10.244.0.0/16",), **kwargs)
    return render_iptables(load([DEMO]).state, cfg).rendered.text


TEXTS = {
    "demo": _demo_text(),
    "demo-localhost-nodeports": _demo_text(nodeport_addresses=("127.0.0.0/8",)),
    "declared-only": "*filter\n:KUBE-SERVICES - [0:0]\n:KUBE-FORWARD\n-A KUBE-FORWARD -j ACCEPT\nCOMMIT\n",
    "odd-lines": "*nat\n:\n-A \n-A\n:KUBE-X - [0:0]\n-A KUBE-X\n\n-X KUBE-SVC-A\n-A KUBE-SEP-1 -j X\nCOMMIT\n",
    "no-trailing-newline": "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j RETURN\nCOMMIT",
}


def _general(text: str, applied: AppliedChains | None = None, *, full: bool = True) -> Filtered:
    return (applied or AppliedChains())._filter(text, full=full)


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_full_sync_fast_path_records_the_general_paths_digests(name: str) -> None:
    text = TEXTS[name]
    fast = AppliedChains().filter(text, full=True)
    assert fast.text is text and fast.skipped == ()
    assert fast.digests == _general(text).digests
    assert fast.digests  # not vacuous: every text above has tracked chains


@pytest.mark.parametrize("odd", ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "é"])
def test_text_the_fast_path_does_not_know_takes_the_general_one(odd: str) -> None:
    # splitlines cuts at these (or the text is not ASCII): the general path's grouping decides.
    text = TEXTS["demo"].replace("kubernetes service portals", f"kubernetes{odd}service portals", 1)
    assert AppliedChains().filter(text, full=True).digests == _general(text).digests


def test_partial_sync_after_a_fast_full_sync_skips_the_unchanged_chains() -> None:
    text = TEXTS["demo"]
    fast, general = AppliedChains(), AppliedChains()
    fast.applied(fast.filter(text, full=True), full=True)
    general.applied(_general(text), full=True)
    after_fast, after_general = fast.filter(text, full=False), general.filter(text, full=False)
    assert after_fast == after_general
    assert "nat/KUBE-SERVICES" in after_fast.skipped


def _reference_with_jumps(text: str, missing: dict[str, list[jumps.Jump]]) -> str:
    """The former `_with_missing_jumps` rebuild: every line, `-I` lines before each COMMIT."""
    out: list[str] = []
    table = ""
    for line in text.splitlines():
        if line == "COMMIT":
            out.extend(f"-I {_rule_spec(j)}" for j in missing.get(table, []))
        elif line.startswith("*"):
            table = line[1:]
        out.append(line)
    return "\n".join(out) + "\n"


def _declared(text: str) -> dict[str, set[str]]:
    declared: dict[str, set[str]] = {}
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            declared.setdefault(table, set()).add(line[1:].split(" ", 1)[0])
    return declared


def _demo_tables(**kwargs: Any) -> tuple[TableText, ...]:
    cfg = ProxyConfig(cluster_cidr=("10.244.0.0/16",), **kwargs)
    result = render_iptables(load([DEMO]).state, cfg)
    rendered, tables = render_tables(result.view, result.options)
    assert restore_text(tables) == result.rendered.text and rendered.text == ""
    return tables


TABLES = {"demo": _demo_tables(), "demo-localhost-nodeports": _demo_tables(nodeport_addresses=("127.0.0.0/8",))}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_missing_jumps_are_inserted_as_the_line_rebuild_did(name: str) -> None:
    tables = TABLES[name]
    text = restore_text(tables)
    proxier = IptablesProxier(run=FakeIptables().run)  # a fresh fake: every jump is missing
    got, added = proxier._with_missing_jump_tables(tables)
    declared = _declared(text)
    missing: dict[str, list[jumps.Jump]] = {}
    for j in jumps.ENSURE_ORDER:
        if j.target in declared.get(j.table, set()):
            missing.setdefault(j.table, []).append(j)
    assert restore_text(got) == _reference_with_jumps(text, missing)
    assert added == sum(map(len, missing.values())) > 0
    assert restore_text(tables) == text  # the rendered tables themselves are left as they were


def test_no_missing_jump_leaves_the_tables_as_they_are() -> None:
    fake = FakeIptables()
    proxier = IptablesProxier(run=fake.run)
    tables = TABLES["demo"]
    for j in jumps.ENSURE_ORDER:
        fake.run(["iptables", "-w", "-t", j.table, "-N", j.target], check=False)
        fake.run(["iptables", "-w", "-t", j.table, "-I", *_rule_args(j)], check=True)
    got, added = proxier._with_missing_jump_tables(tables)
    assert got is tables and added == 0


@pytest.mark.parametrize("name", sorted(TABLES))
def test_full_sync_pieces_record_the_joined_texts_digests(name: str) -> None:
    chunks = list(restore_chunks(TABLES[name]))
    text = "".join(chunks)
    fast = AppliedChains().filter_chunks(chunks, full=True)
    assert fast.chunks is chunks and fast.restore_input is chunks and fast.text == ""
    assert fast.digests == _general(text).digests and fast.digests
    # A partial sync's pieces are joined and filtered as one text.
    applied = AppliedChains()
    applied.applied(fast, full=True)
    assert applied.filter_chunks(chunks, full=False) == AppliedChains(dict(applied._applied)).filter(text, full=False)


@pytest.mark.parametrize("cut", [1, 7, 40])
def test_pieces_that_are_not_whole_lines_take_the_general_path(cut: int) -> None:
    # A line cut in two between pieces would be two lines to the regex: the join decides.
    text = restore_text(TABLES["demo"])
    chunks = [text[:cut], text[cut:]]
    got = AppliedChains().filter_chunks(chunks, full=True)
    assert got.restore_input is chunks and got.digests == _general(text).digests


def test_a_full_sync_digests_its_chains_after_its_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the next partial sync needs them: worked out before the restore, they would delay
    # the rules reaching the kernel.
    result = render_iptables(load([DEMO]).state, CFG, nfacct_counters=())
    fake = FakeIptables()
    proxier = IptablesProxier(run=fake.run)
    proxier.prepare()
    restored_before: list[bool] = []
    digest = last_restore._digest

    def spy(lines: list[str]) -> bytes:
        restored_before.append("-A KUBE-SERVICES" in fake.run(["iptables-save", "-t", "nat"]).stdout)
        return digest(lines)

    monkeypatch.setattr(last_restore, "_digest", spy)
    proxier.sync(result.view, result.options, None)
    assert restored_before and all(restored_before)
    # The digests recorded are those of the text restored, as the general path works them out.
    assert proxier._applied._applied == _general(result.rendered.text).digests


def test_the_report_keeps_counts_not_the_restore_text() -> None:
    result = render_iptables(load([DEMO]).state, CFG, nfacct_counters=())
    fake = FakeIptables()
    proxier = IptablesProxier(run=fake.run)
    proxier.prepare()
    report = proxier.sync(result.view, result.options, None)
    assert report.rendered.text == ""
    assert "nat_chains" not in report.rendered.__dict__  # nor the set of active chains, unless asked for
    assert report.rendered.nat_chains == result.rendered.nat_chains
    assert report.rule_counts == {"filter": result.rendered.filter_rules, "nat": result.rendered.nat_rules_total}
    declared = _declared(result.rendered.text)
    assert report.jumps_added == sum(j.target in declared[j.table] for j in jumps.ENSURE_ORDER) > 0
    saved = fake.run(["iptables-save", "-t", "nat"]).stdout
    assert "-A KUBE-SERVICES" in saved  # the text was restored before it was dropped


LINES = st.sampled_from(
    [
        "*nat",
        "*filter",
        "COMMIT",
        "",
        ":",
        "-A ",
        "-A",
        "-X KUBE-SVC-A",
        ":KUBE-SERVICES - [0:0]",
        ":KUBE-SVC-A - [0:0]",
        "-A KUBE-SERVICES -j KUBE-SVC-A",
        "-A KUBE-SEP-1 -j X",
        "-A KUBE-FORWARD",
        "-A KUBE-X -m comment --comment x",
        " -A KUBE-X",
        "-I INPUT -j KUBE-X",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(LINES, max_size=6), max_size=8), st.booleans())
def test_any_whole_line_pieces_record_the_general_paths_digests(pieces: list[list[str]], trailing: bool) -> None:
    chunks = ["".join(f"{line}\n" for line in lines) for lines in pieces]
    if chunks and not trailing:
        chunks[-1] = chunks[-1].removesuffix("\n")  # the text may end without a line break
    text = "".join(chunks)
    assert AppliedChains().filter_chunks(chunks, full=True).digests == _general(text).digests
    assert AppliedChains().filter(text, full=True).digests == _general(text).digests

"""Which dump format is this? iptables-save, an `iptables -L` listing, nft JSON, or nft text."""

from __future__ import annotations

import re

from kubeproxy.netfilter.ruleset import ParseError, Ruleset

FORMATS = ("iptables-save", "iptables-list", "nft-json", "nft")
LAZY_ABOVE_RULES = 20_000

_SAVE = re.compile(r"^\s*(\*(filter|nat|mangle|raw|security)\s*$|-A \S+|:\S+ (ACCEPT|DROP|-) )", re.M)
_LIST = re.compile(r"^\s*Chain \S+ \((policy \w+|\d+ references?)", re.M)
_NFT = re.compile(r"^\s*table\s+(ip|ip6|inet|arp|bridge|netdev)\s+\S+\s*\{", re.M)


def detect(text: str) -> str:
    """Guess the format; raises ParseError (line 1) when nothing fits."""
    head = text.lstrip()
    if head.startswith("{") and '"nftables"' in head[:200]:
        return "nft-json"
    if _LIST.search(text):
        return "iptables-list"
    if _NFT.search(text):
        return "nft"
    if _SAVE.search(text):
        return "iptables-save"
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    raise ParseError(1, first.strip(), "not iptables-save, `iptables -L`, `nft -j list ruleset` or nft text; "
                     "say which with --format")


def parse(text: str, fmt: str = "auto") -> Ruleset:
    """Parse a dump in the given (or detected) format."""
    if fmt == "auto":
        fmt = detect(text)
    if fmt == "iptables-save":
        from kubeproxy.netfilter import iptables_save

        # Every rule body is checked up front unless the dump is huge: then bodies are parsed
        # when the trace reaches them (a 300k-rule dump loads in about a second instead of six).
        return iptables_save.parse(text, lazy=text.count("\n-A ") > LAZY_ABOVE_RULES)
    if fmt == "iptables-list":
        from kubeproxy.netfilter import iptables_list

        return iptables_list.parse(text)
    if fmt == "nft-json":
        from kubeproxy.netfilter import nft_json

        return nft_json.parse(text)
    if fmt == "nft":
        from kubeproxy.netfilter import nft_json

        return nft_json.parse_text(text)
    raise ValueError(f"unknown format {fmt!r}: one of auto, {', '.join(FORMATS)}")

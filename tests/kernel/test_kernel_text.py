"""The second line of defence: strings that slipped past validation never change rule text.

`cluster/` rejects such names as the API server does; here they are put straight into the node
model (as a future source or field might), rendered in both modes and loaded into a namespace:
the load succeeds, nothing but the intended rules appear, and the other Service is intact.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from kubeproxy.backends.iptables.apply import restore
from kubeproxy.backends.iptables.render import render as render_iptables
from kubeproxy.backends.nftables.render import render as render_nft
from kubeproxy.backends.userspace.render import render as render_userspace
from kubeproxy.kernel import kernel_text
from kubeproxy.lab import netns as L
from kubeproxy.model.node_model import NodeView, ServicePortName
from tests.backends.nftables.helpers import NODE, endpoint, options, port, service, slice_, view

HOSTILE = [
    'a"\n-A INPUT -j ACCEPT\n#',
    "x\nCOMMIT\n*filter\n-A INPUT -j DROP",
    "sp ace }; add rule ip kube-proxy services drop #",
    "-A",
    "nul\x00byte",
    "ünïcødé",
    "q" * 65536,
]


@pytest.mark.parametrize("text", HOSTILE)
def test_words_and_comments_hold_no_separator(text: str) -> None:
    for out in (kernel_text.word(text), kernel_text.nft_name(text)):
        assert not set(out) & set(" \n\t\"'\\;#{}\x00")
    quoted = kernel_text.nft_quoted(text)
    assert quoted.count('"') == 2 and "\n" not in quoted and len(quoted.encode()) <= kernel_text.NFT_COMMENT_MAX + 2
    comment = kernel_text.iptables_comment(text)
    assert '"' not in comment and "\n" not in comment and len(comment.encode()) <= kernel_text.IPTABLES_COMMENT_MAX


def test_valid_names_are_unchanged() -> None:
    spn, chain = "kube-system/kube-dns:dns-tcp", "service-ABCD1234-ns/name/tcp/p80"
    assert kernel_text.word(spn) == spn and kernel_text.nft_name(chain) == chain
    longest = f"{'n' * 63}/{'s' * 63}:{'p' * 15}"
    assert kernel_text.word(longest) == longest
    assert kernel_text.nft_quoted(spn) == f'"{spn}"'
    assert kernel_text.nft_quoted("x" * 200) == f'"{"x" * kernel_text.NFT_COMMENT_MAX}"'


def _hostile_view(text: str) -> NodeView:
    """A cluster of two Services whose first one is renamed to `text` past validation."""
    objs = [
        service("ns", "evil", "172.30.0.1", port("p", 80, nodePort=30080), type="NodePort", sessionAffinity="ClientIP"),
        slice_("ns", "evil", [endpoint("10.180.0.1", NODE)], ("p", 80, "TCP")),
        service("ns", "nobody", "172.30.0.3", port("p", 80)),  # no endpoints: comments in both modes
        service("ns", "good", "172.30.0.2", port("p", 80)),
        slice_("ns", "good", [endpoint("10.180.0.2", NODE)], ("p", 80, "TCP")),
    ]
    v = view(objs)
    rename = {n: ServicePortName(text, text, text, n.protocol) for n in v.services if n.name != "good"}
    services = {rename.get(n, n): dataclasses.replace(info, name=rename.get(n, n)) for n, info in v.services.items()}
    endpoints = {rename.get(n, n): eps for n, eps in v.endpoints.items()}
    return NodeView(services, endpoints)


@pytest.mark.root
@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_names_past_validation_load_as_intended(text: str) -> None:
    v = _hostile_view(text)
    with L.netns("kpt") as ns:
        restore(render_iptables(v, options()).text, ns)
        saved = ns.run(["iptables-save"]).stdout
        assert "-A INPUT -j" not in saved and "COMMIT\n*filter\n-A INPUT" not in saved
        assert '"ns/good:p cluster IP"' in saved and "10.180.0.2:80" in saved
    with L.netns("kpt") as ns:
        ns.run(["nft", "-f", "-"], input=render_nft(v, options()).text())
        listed = ns.run(["nft", "list", "ruleset"]).stdout
        # the hostile text may sit inside a comment (elements name their Service): outside
        # the quoted strings it must be nowhere
        unquoted = re.sub(r'"[^"]*"', '""', listed)
        assert unquoted.count("table ") == 1  # ours only
        assert "services drop" not in unquoted
        assert "172.30.0.2 . tcp . 80" in listed and "10.180.0.2 . 80" in listed
    # userspace mode: one redirect per service address, commented with the (made safe) name
    with L.netns("kpt") as ns:
        ports = {name: 40000 + i for i, name in enumerate(sorted(v.services, key=str))}
        restore(render_userspace(v, options(), ports).text, ns)
        saved = ns.run(["iptables-save", "-t", "nat"]).stdout
        assert "-A INPUT" not in saved and "-A PREROUTING -j" not in saved
        good = next(n for n in v.services if n.name == "good")
        assert f"--to-ports {ports[good]}" in saved and '"ns/good:p"' in saved

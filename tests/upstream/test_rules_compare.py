"""The side-by-side comparison's normalisation (kubeproxy/lab/rules_compare.py): what it makes
equal (Service order in map-order chains, a node's own endpoints by role) and what it must still
tell apart."""

from __future__ import annotations

from kubeproxy.lab import rules_compare as rc

PODS = {"10.244.1.10": "lweb-node-a", "10.244.2.10": "lweb-node-b", "10.244.3.10": "web-remote"}
NODEPORTS_TAIL = (
    '-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" '
    "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
)
WEB = [
    '-A KUBE-SERVICES -d 10.96.0.10/32 -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-W',
    '-A KUBE-SERVICES -d 198.51.100.1/32 -m comment --comment "default/web:http external IP" -m tcp --dport 80 -j KUBE-EXT-W',
]
DB = ['-A KUBE-SERVICES -d 10.96.0.11/32 -m comment --comment "default/db:sql cluster IP" -m tcp --dport 5432 -j KUBE-SVC-D']


def nat(*chains: tuple[str, list[str]]) -> str:
    declared = "".join(f":{name} - [0:0]\n" for name, _ in chains)
    return "*nat\n" + declared + "".join(rule + "\n" for _, rules in chains for rule in rules) + "COMMIT\n"


def compare(a: str, b: str) -> list[str]:
    return rc.differences(rc.role_named(a, "node-a", PODS), rc.role_named(b, "node-b", PODS), "a", "b")


def test_services_in_another_order_are_equal_in_a_map_order_chain() -> None:
    assert compare(nat(("KUBE-SERVICES", [*WEB, *DB, NODEPORTS_TAIL])), nat(("KUBE-SERVICES", [*DB, *WEB, NODEPORTS_TAIL]))) == []


def test_a_services_own_rules_and_the_fixed_tail_keep_their_order() -> None:
    base = nat(("KUBE-SERVICES", [*WEB, *DB, NODEPORTS_TAIL]))
    assert compare(base, nat(("KUBE-SERVICES", [WEB[1], WEB[0], *DB, NODEPORTS_TAIL])))
    assert compare(base, nat(("KUBE-SERVICES", [*WEB, NODEPORTS_TAIL, *DB])))


def test_other_chains_are_compared_in_order() -> None:
    rules = ['-A KUBE-SVC-W -m comment --comment "default/web:http -> a" -j KUBE-SEP-A',
             '-A KUBE-SVC-W -m comment --comment "default/db:sql -> b" -j KUBE-SEP-B']  # fmt: skip
    assert compare(nat(("KUBE-SVC-W", rules)), nat(("KUBE-SVC-W", rules[::-1])))


def _itp_local(own_ip: str, sep: str) -> str:
    return nat(
        ("KUBE-SVL-L", [f'-A KUBE-SVL-L -m comment --comment "default/lweb:http -> {own_ip}:8080" -j {sep}']),
        (sep, [f'-A {sep} -s {own_ip}/32 -m comment --comment "default/lweb:http" -j KUBE-MARK-MASQ',
               f'-A {sep} -p tcp -m comment --comment "default/lweb:http" -m tcp -j DNAT --to-destination {own_ip}:8080']),
    )  # fmt: skip


def test_an_endpoint_chain_of_the_nodes_own_pod_alone_is_named_by_role() -> None:
    assert compare(_itp_local("10.244.1.10", "KUBE-SEP-AAAA"), _itp_local("10.244.2.10", "KUBE-SEP-BBBB")) == []
    # Not the node's own pod on one side: the chains stay as they are, and differ.
    assert compare(_itp_local("10.244.1.10", "KUBE-SEP-AAAA"), _itp_local("10.244.3.10", "KUBE-SEP-CCCC"))


def test_an_endpoint_chain_a_cluster_chain_jumps_to_keeps_its_name() -> None:
    cluster = '-A KUBE-SVC-L -m comment --comment "default/lweb:http -> 10.244.1.10:8080" -j KUBE-SEP-AAAA'
    dump = _itp_local("10.244.1.10", "KUBE-SEP-AAAA").replace("COMMIT", f":KUBE-SVC-L - [0:0]\n{cluster}\nCOMMIT")
    assert "KUBE-SEP-AAAA" in dict(rc.role_named(dump, "node-a", PODS)["nat"].rules)


def _affinity_local(own_ip: str, sep: str, other: str) -> str:
    """A local chain with session affinity to the node's own pod, whose chain the cluster chain reaches too."""
    recent = f"-m recent --rcheck --seconds 60 --reap --name {sep} --mask 255.255.255.255 --rsource"
    return nat(
        ("KUBE-SVC-L", [f'-A KUBE-SVC-L -m comment --comment "default/lweb:http -> {own_ip}:8080" -j {sep}',
                        f'-A KUBE-SVC-L -m comment --comment "default/lweb:http -> {other}:8080" -j KUBE-SEP-OTHER']),
        ("KUBE-SVL-L", [f'-A KUBE-SVL-L -m comment --comment "default/lweb:http -> {own_ip}:8080" {recent} -j {sep}',
                        f'-A KUBE-SVL-L -m comment --comment "default/lweb:http -> {own_ip}:8080" -j {sep}']),
        (sep, [f'-A {sep} -p tcp -m comment --comment "default/lweb:http" -m tcp -j DNAT --to-destination {own_ip}:8080']),
    )  # fmt: skip


def test_the_affinity_match_of_a_local_chain_names_the_nodes_own_endpoint_by_role() -> None:
    a = _affinity_local("10.244.1.10", "KUBE-SEP-AAAA", "10.244.2.10")
    b = _affinity_local("10.244.2.10", "KUBE-SEP-BBBB", "10.244.1.10")
    local = dict(rc.role_named(a, "node-a", PODS)["nat"].rules)["KUBE-SVL-L"]
    assert "--name LOCAL-ENDPOINT(lweb-<node>:8080) " in local[0]
    # The local chains are equal; the cluster chains, which name every endpoint's chain as it is, are not.
    assert [d.split(":")[0] for d in compare(a, b) if " KUBE-" in d.split(":")[0]] == ["nat KUBE-SVC-L"]

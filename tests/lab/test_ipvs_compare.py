"""lab/ipvs_compare.py on recorded text: two IPVS nodes' state named by role (no root, no VM)."""

from __future__ import annotations

from kubeproxy.lab import ipvs_compare
from kubeproxy.lab.ipvs_compare import DUMMY, IPSET, IPVS, Roles

PODS = {"10.244.1.10": "lweb-0-node-a", "fd00:10:244:1::a": "lweb-0-node-a", "10.244.2.10": "lweb-0-node-b",
        "fd00:10:244:2::a": "lweb-0-node-b", "10.244.3.10": "web-0"}  # fmt: skip
ROLES_A = Roles.of("node-a", ("192.168.30.11", "fd00:30::11"), "node-b", ("192.168.30.12", "fd00:30::12"), PODS)
ROLES_B = Roles.of("node-b", ("192.168.30.12", "fd00:30::12"), "node-a", ("192.168.30.11", "fd00:30::11"), PODS)
IPTABLES = "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\nCOMMIT\n"


def node(own: str, peer: str, node_ip: str, *, order: int = 1, weight: int = 1) -> dict[str, str]:
    """A node's dump: a Local NodePort on its own address to its own pod, a Cluster Service to
    both mirrored pods and a remote one (real servers listed in `order`), hairpin entries."""
    reals = [f"-a -t 10.96.0.10:80 -r {ip}:8080 -m -w {weight}" for ip in (own, peer, "10.244.3.10")][::order]
    virtual = [f"-A -t {node_ip}:30014 -s rr", f"-a -t {node_ip}:30014 -r {own}:8080 -m -w 1", "-A -t 10.96.0.10:80 -s rr -p 300"]
    create = "create KUBE-LOOP-BACK hash:ip,port,ip family inet hashsize 1024 maxelem 65536 bucketsize 12"
    return {
        IPVS: "\n".join([*virtual, *reals]) + "\n",
        IPSET: f"{create} initval 0x{order % 7:08x}\nadd KUBE-LOOP-BACK {own},tcp:8080,{own}\n",
        DUMMY: "9: kube-ipvs0    inet 10.96.0.10/32 scope global kube-ipvs0\\       valid_lft forever preferred_lft forever\n",
        "IPv4": IPTABLES,
        "IPv6": "",
    }


def test_mirror_image_nodes_are_equal_whatever_the_kernels_order_and_hash_seed() -> None:
    a = node("10.244.1.10", "10.244.2.10", "192.168.30.11")
    b = node("10.244.2.10", "10.244.1.10", "192.168.30.12", order=-1)
    assert ipvs_compare.differences(a, ROLES_A, b, ROLES_B, ("a", "b")) == []


def test_a_real_server_weight_differs() -> None:
    a = node("10.244.1.10", "10.244.2.10", "192.168.30.11")
    b = node("10.244.2.10", "10.244.1.10", "192.168.30.12", weight=0)
    diffs = ipvs_compare.differences(a, ROLES_A, b, ROLES_B, ("a", "b"))
    assert len(diffs) == 1 and diffs[0].startswith("ipvs -A -t 10.96.0.10:80 -s rr -p 300:")
    # a remote pod keeps its address: it is the same on both nodes
    assert "-r 10.244.3.10:8080 -m -w 0" in diffs[0] and "-r pod(lweb-0-<peer>):8080 -m -w 1" in diffs[0]


def test_a_virtual_server_on_one_node_only_and_a_set_member() -> None:
    a = node("10.244.1.10", "10.244.2.10", "192.168.30.11")
    b = node("10.244.2.10", "10.244.1.10", "192.168.30.12")
    b[IPVS] += "-A -t 10.96.0.20:80 -s rr\n"
    b[IPSET] += "add KUBE-LOOP-BACK 10.244.3.10,tcp:8080,10.244.3.10\n"
    diffs = ipvs_compare.differences(a, ROLES_A, b, ROLES_B, ("a", "b"))
    assert diffs[0] == "ipvs -A -t 10.96.0.20:80 -s rr: only in b: {}"
    assert diffs[1].startswith("ipset KUBE-LOOP-BACK:") and "10.244.3.10,tcp:8080,10.244.3.10" in diffs[1]
    assert len(diffs) == 2


def test_roles_name_addresses_of_both_families_and_leave_others_alone() -> None:
    text = "-A -t [fd00:30::11]:30014 -s rr\n-a -t [fd00:30::11]:30014 -r [fd00:10:244:1::a]:8080 -m -w 1\n"
    text += "10.244.1.100 10.244.3.10"
    assert ROLES_A.rename(text) == (
        "-A -t [node-ip6(<node>)]:30014 -s rr\n-a -t [node-ip6(<node>)]:30014 -r [pod6(lweb-0-<node>)]:8080 -m -w 1\n"
        "10.244.1.100 10.244.3.10"
    )
    assert ROLES_B.rename("192.168.30.11 fd00:10:244:1::a") == "node-ip(<peer>) pod6(lweb-0-<peer>)"


def test_iptables_rules_are_compared_per_family() -> None:
    a = node("10.244.1.10", "10.244.2.10", "192.168.30.11")
    b = node("10.244.2.10", "10.244.1.10", "192.168.30.12")
    b["IPv4"] = IPTABLES.replace("-j ACCEPT", "-j RETURN")
    diffs = ipvs_compare.differences(a, ROLES_A, b, ROLES_B, ("a", "b"))
    assert len(diffs) == 1 and diffs[0].startswith("IPv4 nat KUBE-SERVICES:")


def test_out_filter_drops_in_another_order_are_equal_but_a_missing_one_differs() -> None:
    """Upstream appends KUBE-IPVS-OUT-FILTER's DROPs while ranging over a Go map of Services."""
    drops = [
        f"-A KUBE-IPVS-OUT-FILTER -s {ip} -m ipvs --vaddr {ip} --vproto tcp --vport 80 -j DROP"
        for ip in ("203.0.113.10", "203.0.113.11")
    ]
    chain = "*filter\n:KUBE-IPVS-OUT-FILTER - [0:0]\n{}\nCOMMIT\n"
    a = node("10.244.1.10", "10.244.2.10", "192.168.30.11")
    b = node("10.244.2.10", "10.244.1.10", "192.168.30.12")
    a["IPv4"] = IPTABLES + chain.format("\n".join(drops))
    b["IPv4"] = IPTABLES + chain.format("\n".join(drops[::-1]))
    assert ipvs_compare.differences(a, ROLES_A, b, ROLES_B, ("a", "b")) == []
    b["IPv4"] = IPTABLES + chain.format(drops[0])
    diffs = ipvs_compare.differences(a, ROLES_A, b, ROLES_B, ("a", "b"))
    assert len(diffs) == 1 and diffs[0].startswith("IPv4 filter KUBE-IPVS-OUT-FILTER:")

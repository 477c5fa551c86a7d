"""`kubeproxy run --snat-watch` on a real kernel: a masqueraded UDP service, real flows, the metric and the warning.

The bed is the lab's MiniCluster: the client sends UDP queries to a Service's external IP
(eTP=Cluster), the node DNATs them to pod a and masquerades them to its own address, so each
query holds one conntrack tuple `pod a:5353 -> node:port`. The proxy's gauge must count exactly
those (its ctnetlink dump is complete below --snat-watch-max-entries) and warn once when the
Service passes the (deliberately tiny) threshold; without the flag nothing is sampled.
"""

from __future__ import annotations

import re
import sys

import pytest

from kubeproxy.lab.builders import Port, endpoint_slice, service
from kubeproxy.lab.cluster import METRICS_BIND, NODE_IP, ClusterError, MiniCluster, poll

pytestmark = pytest.mark.root

DNS = Port("dns", 53, 5353, "UDP")
EXTERNAL_IP = "203.0.113.10"
CLUSTER_CIDR = "10.244.0.0/16"
FETCH = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())"
WARNING = "SNAT ports nearly exhausted"


def _metrics(c: MiniCluster) -> str:
    proc = c.node.run([sys.executable, "-c", FETCH, f"http://{METRICS_BIND}/metrics"], check=False)
    return proc.stdout if proc.returncode == 0 else ""


def _value(text: str, name: str) -> float | None:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def _start(c: MiniCluster, *extra: str) -> None:
    objs = [c.node_object(), service("dns", "10.96.0.53", [DNS], external_ips=[EXTERNAL_IP]),
            endpoint_slice("dns", c.backends("a"), [DNS])]
    c.write_manifests(objs)
    c.start_proxy("--min-sync-period", "0s", "--cluster-cidr", CLUSTER_CIDR, *extra)
    c.wait_synced()


@pytest.mark.parametrize("mode", ["iptables", "nftables"])
def test_snat_watch_exports_the_measured_count_and_warns_once_per_crossing(mode: str) -> None:
    with MiniCluster.build(pods=("a",), remote_pods=(), proxy_mode=mode) as c:
        # 40 of 64,512 ports is past this threshold; 20 is not
        _start(c, "--snat-watch", "100ms", "--snat-watch-threshold", str(30 / 64512))
        got = c.request("udp", c.client, f"{EXTERNAL_IP}:53", count=20)
        assert len(got) == 20 and all(isinstance(r, dict) for r in got), got
        assert {r["src"].rsplit(":", 1)[0] for r in got} == {NODE_IP}  # masqueraded to the node
        series = 'kubeproxy_snat_ports_in_use{service="default/dns:dns"}'
        # The gauge must equal what conntrack holds: 20 flows, or a few more if a loaded machine
        # made the probe resend a query from a new port (which the gauge rightly counts too).
        first = _await_gauge(c, series, 20)
        assert first <= 30 and WARNING not in c.proxy_log()
        c.request("udp", c.client, f"{EXTERNAL_IP}:53", count=20)
        flows = _await_gauge(c, series, first + 20)
        text = _metrics(c)
        assert _value(text, 'kubeproxy_snat_port_utilization{service="default/dns:dns"}') == pytest.approx(flows / 64512)
        assert _value(text, "kubeproxy_snat_ports") == 64512
        assert (_value(text, "kubeproxy_snat_watch_sampled_entries") or 0) >= flows
        # more samples pass while the service stays above: still one warning
        before = _value(text, "kubeproxy_snat_watch_sample_duration_seconds")
        assert before is not None
        poll("a few more samples", lambda: _more_samples(c, text), timeout=60)
        log = c.proxy_log()
        assert log.count(WARNING) == 1, log
        # logged at the first sample past 30, which may have come while the second burst arrived
        in_use = re.search(r"inUse=(\d+)", log)
        assert 'service="default/dns:dns"' in log and in_use is not None and 30 < int(in_use.group(1)) <= flows
        # the flows expire (flushed here, in the node's namespace): back below, said once; then a new crossing
        c.node.run(["conntrack", "-F"])
        poll("the gauge back to 0", lambda: _value(_metrics(c), series) == 0, timeout=60)
        poll("the all-clear", lambda: "SNAT port use back below the threshold" in c.proxy_log(), timeout=60)
        c.request("udp", c.client, f"{EXTERNAL_IP}:53", count=40)
        poll("a second warning", lambda: c.proxy_log().count(WARNING) == 2, timeout=60)


def _flows(c: MiniCluster) -> int:
    """What the gauge counts, read by the conntrack tool instead of our ctnetlink parser: UDP flows
    to the Service's external IP whose replies go to the node's address (masqueraded)."""
    argv = ["conntrack", "-L", "-p", "udp", "--orig-dst", EXTERNAL_IP, "--reply-dst", NODE_IP]
    out = c.node.run(argv, check=False).stdout
    return sum(1 for line in out.splitlines() if line.startswith("udp"))


def _gauge_is_conntrack(c: MiniCluster, series: str, at_least: int) -> int | None:
    """conntrack's count once it is at least `at_least` and the gauge shows the same, else None."""
    flows = _flows(c)
    return flows if flows >= at_least and _value(_metrics(c), series) == flows else None


def _await_gauge(c: MiniCluster, series: str, at_least: int) -> int:
    try:
        return poll("the gauge at conntrack's count", lambda: _gauge_is_conntrack(c, series, at_least), timeout=60)
    except ClusterError as exc:  # say what each side saw, and the proxy's last words
        table = c.node.run(["conntrack", "-L", "-p", "udp"], check=False).stdout
        raise AssertionError(
            f"{exc}: gauge {_value(_metrics(c), series)}, conntrack {_flows(c)} (at least {at_least})\n"
            f"{table}\n{c.proxy_log()[-3000:]}"
        ) from None


def _more_samples(c: MiniCluster, earlier: str) -> bool:
    # the sample duration changes from one sample to the next (a float of perf_counter)
    now = _value(_metrics(c), "kubeproxy_snat_watch_sample_duration_seconds")
    return now is not None and now != _value(earlier, "kubeproxy_snat_watch_sample_duration_seconds")


def test_without_the_flag_nothing_is_sampled() -> None:
    with MiniCluster.build(pods=("a",), remote_pods=()) as c:
        _start(c)
        got = c.request("udp", c.client, f"{EXTERNAL_IP}:53", count=5)
        assert all(isinstance(r, dict) for r in got), got
        text = _metrics(c)
        assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds" in text
        assert "kubeproxy_snat" not in text
        assert "SNAT" not in c.proxy_log()

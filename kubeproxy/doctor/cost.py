"""The first-packet cost of the rules: iptables walks KUBE-SERVICES rule by rule, nftables looks up a map.

Calibrated from `bench/datapath.py` (docs/benchmarks.md): new TCP connections through a service that
sorts last, 10 vs 10,000 services, one at a time on this project's 2-core machine:
18,805 vs 8,083 conn/s (53.2 vs 123.7 us per connection): 70.5 us more for 9,990 more rules, ~7.1 ns
a rule. The nftables mode measured 19,236 vs 17,901 conn/s: flat within noise.
"""

from __future__ import annotations

from kubeproxy.doctor.findings import Finding
from kubeproxy.netfilter.ruleset import Ruleset

NS_PER_RULE = 7.1
BASE_US = 53.2  # the per-connection time at 10 services in the same bench
WARN_RULES, INFO_RULES = 5000, 1000


def cost_findings(ruleset: Ruleset) -> list[Finding]:
    nat = ruleset.table("nat")
    if ruleset.source == "nft-json" or nat is None or "KUBE-SERVICES" not in nat.chains:
        return []
    n = len(nat.chains["KUBE-SERVICES"].rules)
    if n < INFO_RULES:
        return []
    extra_us = n * NS_PER_RULE / 1000
    rate_now = 1e6 / (BASE_US + extra_us)
    rate_flat = 1e6 / BASE_US
    severity = "warning" if n >= WARN_RULES else "info"
    return [Finding(
        severity, "rule-walk-cost", "nat KUBE-SERVICES",
        f"{n:,} rules: up to ~{extra_us:.0f} us more per new flow, ~{rate_now:,.0f} new flows/s per core-path "
        f"against ~{rate_flat:,.0f} with a map",
        [f"the first packet of every new flow (also to non-service addresses) walks up to {n:,} rules "
         f"at ~{NS_PER_RULE} ns each (bench/datapath.py)",
         "nftables mode: one map lookup, measured flat from 10 to 10,000 services"],
        ["switch to --proxy-mode nftables"],
        {"rules": n, "ns_per_rule": NS_PER_RULE, "extra_us": round(extra_us, 1),
         "new_flows_per_s": round(rate_now), "new_flows_per_s_nftables": round(rate_flat)},
        score=-n)]

"""Walk a packet through a ruleset the way the kernel does, with exact probabilities.

Hooks run in kernel order; at each hook the base chains (iptables tables or nft base chains) run
by priority. A random element (`statistic`, `numgen`) splits the walk into branches that carry
their probability, so the result is every outcome with its exact chance, not a sample.

The nat chains only see the first packet of a connection: a packet whose conntrack state is not
NEW skips them, and a connection gets its destination mapping once (PREROUTING or OUTPUT) and its
source mapping once (INPUT or POSTROUTING), as in nf_nat_inet_fn.

One module per job: `branch` (outcomes, hops, the branch a walk carries), `matchers` (iptables
matches), `nft` (nft expressions, sets and maps), `actions` (marks, NAT and other statements),
`engine` (hooks, chains, rules, jumps, branching).
"""

from kubeproxy.netfilter.simulate.branch import ONE, Branch, Hop, Outcome, TraceError, TraceResult, Unknown
from kubeproxy.netfilter.simulate.engine import Simulator, trace
from kubeproxy.netfilter.simulate.matchers import MATCHERS
from kubeproxy.netfilter.simulate.nft import NftEvaluator

__all__ = ["MATCHERS", "ONE", "Branch", "Hop", "NftEvaluator", "Outcome", "Simulator", "TraceError", "TraceResult", "Unknown",
           "trace"]

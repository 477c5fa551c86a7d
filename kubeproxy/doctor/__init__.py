"""`kubeproxy doctor`: what on this node will break, at what load, and why.

The core is pure: `diagnose(DoctorInput) -> Report` reads a ruleset (parsed by kubeproxy.netfilter),
the cluster objects (kubeproxy.cluster) and node facts (sysctls, conntrack counters and entries),
and returns findings, worst first. One module per finding family: `snat`, `conntrack`, `foreign`
(rules of others that change the proxy's outcome, missing jumps, stale chains), `cost`,
`services`. `live` gathers the inputs from a running node (read-only: iptables and ip6tables, or
nft; conntrack of both families); `api` lists the objects from the API server as `kubeproxy run`
does; `graph` draws chains. Each family the rules hold (an nft ruleset may hold both) is traced
with that family's view; the live SNAT gauge's core is kubeproxy.proxy.snat_watch.
"""

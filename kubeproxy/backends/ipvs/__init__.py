"""IPVS mode: IPVS virtual servers, ipsets and a fixed iptables ruleset, as upstream programs them."""

"""The userspace proxy mode: listeners on the node relay each connection; iptables only redirects."""

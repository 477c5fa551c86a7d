"""nftables mode: `render` (pure) builds the table as objects, `NftApplier` diffs and loads it.

render.py explains the layout and the endpoint-selection design, diff.py the order of changes,
apply.py how they reach the kernel. One sync of the live proxy, per IP family:

    applier = NftApplier("ip", run)            # "ip6" for IPv6; one per family, kept for the process
    rendering = None
    ...
    changes = tracker.take(view)               # kubeproxy.model.changes
    rendering = render(view, opts, service_cidrs=cidrs, previous=rendering,
                       changed_services=changes.changed_services)   # None: full render
    result = applier.apply(rendering, full=changes.full)            # NftError: next apply is full
    # log rendering.warnings that are new since the previous rendering (invalid annotations)

and, every syncPeriod, `applier.table_intact()` (one `nft list chain`): False means someone
flushed or deleted the table, and the next sync should be full. `applier.cleanup()` removes the
table (`kubeproxy cleanup`).
"""

from kubeproxy.model.options import NodePortTraits

# Upstream's nftables mode takes NodePorts on the node's primary IPs unless nodePortAddresses
# says otherwise, and with KubeProxyNFTablesLocalhostNodePorts serves them on loopback from a
# listener of its own.
NODEPORTS = NodePortTraits(default_addresses=("primary",), localhost_gate="KubeProxyNFTablesLocalhostNodePorts")

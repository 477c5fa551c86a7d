"""A multi-node lab in network namespaces: three nodes (each running its own `kubeproxy run`
against one test API server), pods on each with routes between nodes as a simple CNI sets them,
a client outside and a load balancer that follows health-check node ports.

- `bed`: `MultiNodeCluster.build()`, the namespaces, addresses, routes, pods and proxies;
- `control`: the test API server, in this process, listening inside the control-plane namespace;
- `lb`: the load balancer process (`python -m kubeproxy.lab.multinode.lb`);
- `balancer`: the test's handle on it (its output, waits on its health view);
- `cli`: `kubeproxy lab cluster`.
"""

from kubeproxy.lab.multinode.bed import MultiNodeCluster, Node
from kubeproxy.lab.multinode.lb_handle import HealthChange, LoadBalancer, Request

__all__ = ["HealthChange", "LoadBalancer", "MultiNodeCluster", "Node", "Request"]

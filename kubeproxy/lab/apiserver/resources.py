"""The resource catalogue: every kind the test API server can serve, where it lives in the URL
space, how strategic merge patch merges its lists, and (for the deploy kinds) its schema and rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lightkube.resources import apps_v1 as lightkube_apps
from lightkube.resources import core_v1 as lightkube_core
from lightkube.resources import rbac_authorization_v1 as lightkube_rbac

from kubeproxy.lab.apiserver.rules import (
    RBAC_GROUP,
    Cause,
    check_cluster_role_binding,
    check_config_map,
    check_daemon_set,
    check_policy_rules,
)
from kubeproxy.lab.apiserver.status_errors import JSON


@dataclass(frozen=True)
class ResourceType:
    """One served resource: where it lives in the URL space and what discovery says about it."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    # Strategic merge patch: list fields (path of map keys from the object root) merged by a key
    # instead of replaced; everything else is atomic, which is right for EndpointSlice lists.
    merge_keys: tuple[tuple[tuple[str, ...], str], ...] = ()
    # Validated kinds: the lightkube model whose schema decodes the object (unknown fields, types)
    # and a check of the rules the real server enforces on top. None: stored as given.
    schema: type | None = None
    check: Callable[[JSON, JSON | None], list[Cause]] | None = None
    # A DELETE answers with the object as it was deleted (the registry's ReturnDeletedObject),
    # else with a Success Status naming it.
    returns_deleted: bool = False

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


_META_MERGE_KEYS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("metadata", "ownerReferences"), "uid"),
    (("metadata", "managedFields"), "manager"),
)

SERVICE = ResourceType(
    "", "v1", "Service", "services", True, ("svc",), (*_META_MERGE_KEYS, (("spec", "ports"), "port")), returns_deleted=True
)
ENDPOINT_SLICE = ResourceType("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True, (), _META_MERGE_KEYS)
NODE = ResourceType(
    "",
    "v1",
    "Node",
    "nodes",
    False,
    ("no",),
    (*_META_MERGE_KEYS, (("status", "addresses"), "type"), (("status", "conditions"), "type")),
)
NAMESPACE = ResourceType("", "v1", "Namespace", "namespaces", False, ("ns",), _META_MERGE_KEYS, returns_deleted=True)
# What kube-proxy writes (its Events about the Node), stored as given.
EVENT = ResourceType("events.k8s.io", "v1", "Event", "events", True, ("ev",), _META_MERGE_KEYS)

# The cluster's service ranges, which kube-proxy lists and watches.
SERVICE_CIDR = ResourceType("networking.k8s.io", "v1", "ServiceCIDR", "servicecidrs", False, (), _META_MERGE_KEYS)

DEFAULT_RESOURCES: tuple[ResourceType, ...] = (SERVICE, ENDPOINT_SLICE, NODE, NAMESPACE, EVENT, SERVICE_CIDR)


_CONTAINER_LISTS = (("spec", "template", "spec", "containers"), ("spec", "template", "spec", "initContainers"))
DAEMON_SET = ResourceType(
    "apps",
    "v1",
    "DaemonSet",
    "daemonsets",
    True,
    ("ds",),
    (
        *_META_MERGE_KEYS,
        *((path, "name") for path in _CONTAINER_LISTS),
        *(((*path, "env"), "name") for path in _CONTAINER_LISTS),
        *(((*path, "volumeMounts"), "mountPath") for path in _CONTAINER_LISTS),
        *(((*path, "ports"), "containerPort") for path in _CONTAINER_LISTS),
        (("spec", "template", "spec", "volumes"), "name"),
        (("spec", "template", "spec", "imagePullSecrets"), "name"),
    ),
    schema=lightkube_apps.DaemonSet,
    check=check_daemon_set,
)
SERVICE_ACCOUNT = ResourceType(
    "", "v1", "ServiceAccount", "serviceaccounts", True, ("sa",), (*_META_MERGE_KEYS, (("secrets",), "name")),
    schema=lightkube_core.ServiceAccount, returns_deleted=True,
)  # fmt: skip
CONFIG_MAP = ResourceType(
    "", "v1", "ConfigMap", "configmaps", True, ("cm",), _META_MERGE_KEYS, schema=lightkube_core.ConfigMap, check=check_config_map
)
CLUSTER_ROLE = ResourceType(
    RBAC_GROUP, "v1", "ClusterRole", "clusterroles", False, (), _META_MERGE_KEYS,
    schema=lightkube_rbac.ClusterRole, check=check_policy_rules,
)  # fmt: skip
CLUSTER_ROLE_BINDING = ResourceType(
    RBAC_GROUP, "v1", "ClusterRoleBinding", "clusterrolebindings", False, (), _META_MERGE_KEYS,
    schema=lightkube_rbac.ClusterRoleBinding, check=check_cluster_role_binding,
)  # fmt: skip

SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

# What `kubectl apply -f deploy/` needs on top of the proxy's own kinds.
DEPLOY_RESOURCES: tuple[ResourceType, ...] = (
    *DEFAULT_RESOURCES,
    DAEMON_SET,
    SERVICE_ACCOUNT,
    CONFIG_MAP,
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
)


@dataclass(frozen=True)
class Route:
    """A parsed resource URL."""

    rt: ResourceType
    namespace: str | None
    name: str | None


def route_of(resources: Sequence[ResourceType], path: str) -> Route | None:
    """The resource URL `path` names among `resources`, or None."""
    for rt in resources:
        prefix = rt.prefix()
        if not path.startswith(prefix + "/"):
            continue
        parts = path[len(prefix) + 1 :].strip("/").split("/")
        if rt.namespaced and len(parts) >= 3 and parts[0] == "namespaces" and parts[2] == rt.plural:
            if len(parts) in (3, 4):
                return Route(rt, parts[1], parts[3] if len(parts) == 4 else None)
        elif parts[0] == rt.plural and len(parts) in (1, 2):
            return Route(rt, None, parts[1] if len(parts) == 2 else None)
    return None

"""A small in-memory Kubernetes API server for tests and demos.

It speaks enough of the real protocol that both our reflector and the real `kubectl` can use it:

- discovery (`/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>[/<version>]`) and a minimal
  `/openapi/v3` that tells `kubectl` the server validates fields itself (so `kubectl apply` does not
  need the full schema);
- list and watch for Services, EndpointSlices, Nodes and Namespaces, cluster-wide and per namespace,
  with `fieldSelector` (`metadata.name`, `metadata.namespace`) and simple `labelSelector`s; with
  `resources=DEPLOY_RESOURCES` also DaemonSets, ConfigMaps, ServiceAccounts, ClusterRoles and
  ClusterRoleBindings, so that `kubectl apply -f deploy/` works;
- lists in pages as the real server pages them (`paging`): whole at resourceVersion "0", else
  `limit` pages with `continue` tokens (410 Expired once the history passed the token's version);
- watch streams are chunked JSON, one event per line, from a `resourceVersion`; a version older
  than the retained history gets an ERROR event carrying a 410 Status, as the real server does;
  BOOKMARKs are sent when the client asked for them (periodically, on demand via `bookmark()`,
  and 2 s before a watch's timeout once anything changed since it began), never older than the
  version the watch started from; `sendInitialEvents=true` (watch-list) sends the state, then a
  BOOKMARK annotated `k8s.io/initial-events-end`;
- a version newer than the store's, as upstream's watch cache answers it after waiting
  `block_timeout` (3 s) for the store to catch up: a list gets a 504 Timeout "Too large resource
  version" Status (cause ResourceVersionTooLarge, `Retry-After: 1`), a watch-list gets it as an
  ERROR event, and a plain watch is accepted and stays silent until the store passes that version;
- create, update, patch (JSON merge, strategic merge for the fields our kinds use, JSON patch,
  server-side apply) and delete, with Status objects and the real 404/409 reasons; `dryRun=All`
  answers as the real write would and stores nothing.

Objects are stored as plain JSON dicts with one global, monotonically increasing resourceVersion,
like etcd behind the real server. The store outlives the HTTP listener, so `stop()` then `start()`
simulates the API server going down and coming back with the same state; `drop_watches()` cuts
every open watch mid-stream; `fail_with(503)` makes resource requests fail; `expire_history()`
compacts the event history so older watches get 410 Gone; `restart_with_fresh_store()` comes back
with the same objects under versions that start again near 1 (etcd replaced or restored from an
old backup); `end_watches_with(status)` ends open watches with an ERROR event; `bookmark(rv)`
sends a bookmark carrying any version, even an older one.

It binds 127.0.0.1 only and does no authentication. The proxy's own kinds are not validated: a
malformed Service is stored as given, which is what the tests of our consumers want. The deploy
kinds are validated as the real server does (schema from lightkube's models, `fieldValidation`,
the rules upstream enforces for what deploy/ uses), so a broken manifest fails here too; they
cannot be created in a namespace that does not exist (such a server starts with the system ones).

tests/upstream/test_apiserver_conformance.py asks it and upstream's kube-apiserver the same
requests and compares the answers (the differences left are listed there).

One module per job: `resources` (the catalogue of served kinds), `selectors`, `paging`, `patches` (merge,
strategic merge, JSON patch), `rules` and `admission` (what the real server refuses), `errors`
(Status objects), `store` (objects, versions, history), `discovery`, `handler` (HTTP), `watch`
(watch streams), `server` (`ApiServer`) and `cli` (`python -m kubeproxy.lab.apiserver`).
"""

from kubeproxy.lab.apiserver.admission import FIELD_VALIDATION, admit, invalid_error
from kubeproxy.lab.apiserver.discovery import SERVER_VERSION
from kubeproxy.lab.apiserver.lifecycle import ApiServer
from kubeproxy.lab.apiserver.patches import json_patch, merge_patch, strategic_merge_patch
from kubeproxy.lab.apiserver.resources import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    CONFIG_MAP,
    DAEMON_SET,
    DEFAULT_RESOURCES,
    DEPLOY_RESOURCES,
    ENDPOINT_SLICE,
    EVENT,
    NAMESPACE,
    NODE,
    SERVICE,
    SERVICE_ACCOUNT,
    SYSTEM_NAMESPACES,
    ResourceType,
    Route,
)
from kubeproxy.lab.apiserver.rules import Cause
from kubeproxy.lab.apiserver.selectors import Selector, selector_matches
from kubeproxy.lab.apiserver.serve_command import main
from kubeproxy.lab.apiserver.status_errors import (
    BLOCK_TIMEOUT,
    JSON,
    TOO_LARGE_RETRY_SECONDS,
    ApiError,
    status_object,
    too_large_resource_version,
)
from kubeproxy.lab.apiserver.store import Event, Store

__all__ = [
    "BLOCK_TIMEOUT",
    "CLUSTER_ROLE",
    "CLUSTER_ROLE_BINDING",
    "CONFIG_MAP",
    "DAEMON_SET",
    "DEFAULT_RESOURCES",
    "DEPLOY_RESOURCES",
    "ENDPOINT_SLICE",
    "EVENT",
    "FIELD_VALIDATION",
    "JSON",
    "NAMESPACE",
    "NODE",
    "SERVER_VERSION",
    "SERVICE",
    "SERVICE_ACCOUNT",
    "SYSTEM_NAMESPACES",
    "TOO_LARGE_RETRY_SECONDS",
    "ApiError",
    "ApiServer",
    "Cause",
    "Event",
    "ResourceType",
    "Route",
    "Selector",
    "Store",
    "admit",
    "invalid_error",
    "json_patch",
    "main",
    "merge_patch",
    "selector_matches",
    "status_object",
    "strategic_merge_patch",
    "too_large_resource_version",
]

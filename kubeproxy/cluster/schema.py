"""The fields of Services, EndpointSlices and Nodes as msgspec types: a typed JSON decoder of bounded depth.

`decode_typed(text)` gives the document as structs, which `split_list` and `iter_plain` turn into
exactly what `msgspec.json.decode(text)` gives (plain dicts, lists, strings, numbers; keys in the
schema's order), or None when the text holds anything this schema does not describe: a field it
does not list, a value of another type (a port written as "80", a label value as 5), another
kind's fields. None sends the caller to the general decoder, which reads everything and words
every error, so the typed path can never accept or refuse differently; it only skips work.

Why: the general path must walk the decoded tree once to refuse documents nested deeper than
MAX_DEPTH (0.13-0.16 s of 20k objects, bench/decode.py); a document this decoder accepts is
nested at most `SCHEMA_DEPTH` levels by construction (every field has a fixed type, none refers
back to an enclosing one: `Document.items` holds `Item`s, which have no `items`), so no walk is
needed. Unknown fields are refused rather than skipped (`forbid_unknown_fields`) because a skipped
field could hide a hostile nesting that the general path must still refuse with its message.

The structs are also read directly, without making dicts (cluster/typed.py): `render.load` does
so for files this decoder takes (`manifests.parse_objects`), and `decode_list` gives an API
server's list response that way. `as_plain` turns any item into its dicts for the general parsers.

The field list is upstream's core/v1 Service, Node and discovery/v1 EndpointSlice, plus the
metadata kubectl and API servers send, `managedFields` included: its free-form `fieldsV1` tree is
typed as maps of maps up to a fixed depth (`ManagedFieldsEntry`), so a real list body takes the
typed path and a deeper or odd one takes the general path, which refuses or accepts it as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

from kubeproxy.cluster.bulk import paused_gc

# Every field is optional (UNSET: absent, dropped by `to_builtins`), and null where JSON may hold
# null; whether a value is *valid* is decided later by cluster.objects, the same way for both paths.


# Not gc=False (untracked structs), although they cannot form a cycle: `iter_plain` frees each
# struct as it makes its dicts, and only a tracked struct's release offsets the collector's count
# of new dicts; untracked, a 20k-object file set off 250 collections instead of 30 (2.4x the time).
class _Strict(Struct, forbid_unknown_fields=True, omit_defaults=True):
    pass


Text = str | UnsetType | None
Number = int | UnsetType | None
Flag = bool | UnsetType | None
Texts = list[str] | UnsetType | None
TextMap = dict[str, str] | UnsetType | None


class OwnerReference(_Strict):
    apiVersion: Text = UNSET
    kind: Text = UNSET
    name: Text = UNSET
    uid: Text = UNSET
    controller: Flag = UNSET
    blockOwnerDeletion: Flag = UNSET


class _NoFields(_Strict):
    """The `{}` that ends each path of a field set."""


# A managedFields entry's `fieldsV1` (the set of fields a manager owns) is a tree of maps whose
# keys are field names ("f:spec", "k:{...}", ".") and whose leaves are `{}`: typed as maps of a
# bounded depth, so the schema's depth stays bounded by construction. 13 levels of maps below an
# entry: a Service's deepest real path ("f:spec" "f:ports" "k:{...}" "f:port" {}) is 5, a
# Deployment's ~10. A deeper (or any other) shape is outside the schema: the general path decides.
_Fields1 = dict[str, _NoFields]
_Fields2 = dict[str, _Fields1]
_Fields3 = dict[str, _Fields2]
_Fields4 = dict[str, _Fields3]
_Fields5 = dict[str, _Fields4]
_Fields6 = dict[str, _Fields5]
_Fields7 = dict[str, _Fields6]
_Fields8 = dict[str, _Fields7]
_Fields9 = dict[str, _Fields8]
_Fields10 = dict[str, _Fields9]
_Fields11 = dict[str, _Fields10]
_Fields12 = dict[str, _Fields11]


class ManagedFieldsEntry(_Strict):
    """One entry of `metadata.managedFields` (server-side apply), which an API server sends with
    every object. kube-proxy never reads it (upstream's informers keep it; nothing in
    pkg/proxy looks at it), and neither does cluster/typed.py: it is typed only so that real list
    bodies stay within the schema. The structs die when their objects are built (the state keeps
    no struct), so the entries are not kept either."""

    manager: Text = UNSET
    operation: Text = UNSET
    apiVersion: Text = UNSET
    time: Text = UNSET
    fieldsType: Text = UNSET
    fieldsV1: _Fields12 | UnsetType | None = UNSET
    subresource: Text = UNSET


class Metadata(_Strict):
    name: Text = UNSET
    namespace: Text = UNSET
    labels: TextMap = UNSET
    annotations: TextMap = UNSET
    uid: Text = UNSET
    resourceVersion: Text = UNSET
    generation: Number = UNSET
    creationTimestamp: Text = UNSET
    deletionTimestamp: Text = UNSET
    deletionGracePeriodSeconds: Number = UNSET
    generateName: Text = UNSET
    ownerReferences: list[OwnerReference] | UnsetType | None = UNSET
    finalizers: Texts = UNSET
    managedFields: list[ManagedFieldsEntry] | UnsetType | None = UNSET
    # A List's own metadata.
    selfLink: Text = UNSET
    # `continue` is a Python keyword: the field is renamed on the wire.
    continue_: Text = msgspec.field(default=UNSET, name="continue")
    remainingItemCount: Number = UNSET


class Port(_Strict):
    name: Text = UNSET
    protocol: Text = UNSET
    port: Number = UNSET
    nodePort: Number = UNSET
    targetPort: int | str | UnsetType | None = UNSET
    appProtocol: Text = UNSET


class ClientIPConfig(_Strict):
    timeoutSeconds: Number = UNSET


class SessionAffinityConfig(_Strict):
    clientIP: ClientIPConfig | UnsetType | None = UNSET


class Taint(_Strict):
    key: Text = UNSET
    value: Text = UNSET
    effect: Text = UNSET
    timeAdded: Text = UNSET


class Spec(_Strict):
    # Service
    type: Text = UNSET
    clusterIP: Text = UNSET
    clusterIPs: Texts = UNSET
    ports: list[Port] | UnsetType | None = UNSET
    selector: TextMap = UNSET
    externalIPs: Texts = UNSET
    externalName: Text = UNSET
    loadBalancerIP: Text = UNSET
    loadBalancerClass: Text = UNSET
    loadBalancerSourceRanges: Texts = UNSET
    externalTrafficPolicy: Text = UNSET
    internalTrafficPolicy: Text = UNSET
    healthCheckNodePort: Number = UNSET
    sessionAffinity: Text = UNSET
    sessionAffinityConfig: SessionAffinityConfig | UnsetType | None = UNSET
    ipFamilies: Texts = UNSET
    ipFamilyPolicy: Text = UNSET
    allocateLoadBalancerNodePorts: Flag = UNSET
    publishNotReadyAddresses: Flag = UNSET
    trafficDistribution: Text = UNSET
    # Node
    podCIDR: Text = UNSET
    podCIDRs: Texts = UNSET
    providerID: Text = UNSET
    unschedulable: Flag = UNSET
    taints: list[Taint] | UnsetType | None = UNSET


class IngressPort(_Strict):
    port: Number = UNSET
    protocol: Text = UNSET
    error: Text = UNSET


class Ingress(_Strict):
    ip: Text = UNSET
    hostname: Text = UNSET
    ipMode: Text = UNSET
    ports: list[IngressPort] | UnsetType | None = UNSET


class LoadBalancerStatus(_Strict):
    ingress: list[Ingress] | UnsetType | None = UNSET


class NodeAddress(_Strict):
    type: Text = UNSET
    address: Text = UNSET


class Status(_Strict):
    loadBalancer: LoadBalancerStatus | UnsetType | None = UNSET
    addresses: list[NodeAddress] | UnsetType | None = UNSET


class Conditions(_Strict):
    ready: Flag = UNSET
    serving: Flag = UNSET
    terminating: Flag = UNSET


class Hint(_Strict):
    name: Text = UNSET


class Hints(_Strict):
    forZones: list[Hint] | UnsetType | None = UNSET
    forNodes: list[Hint] | UnsetType | None = UNSET


class TargetRef(_Strict):
    kind: Text = UNSET
    namespace: Text = UNSET
    name: Text = UNSET
    uid: Text = UNSET
    apiVersion: Text = UNSET
    resourceVersion: Text = UNSET


class Endpoint(_Strict):
    addresses: Texts = UNSET
    conditions: Conditions | UnsetType | None = UNSET
    hostname: Text = UNSET
    nodeName: Text = UNSET
    zone: Text = UNSET
    hints: Hints | UnsetType | None = UNSET
    targetRef: TargetRef | UnsetType | None = UNSET
    deprecatedTopology: TextMap = UNSET  # not read: v1beta1's topology, readable (not writable) in v1


class Item(_Strict):
    """One Service, EndpointSlice or Node (the fields of all three: each reads only its own)."""

    apiVersion: Text = UNSET
    kind: Text = UNSET
    metadata: Metadata | UnsetType | None = UNSET
    spec: Spec | UnsetType | None = UNSET
    status: Status | UnsetType | None = UNSET
    addressType: Text = UNSET
    endpoints: list[Endpoint] | UnsetType | None = UNSET
    ports: list[Port] | UnsetType | None = UNSET


class Document(Item):
    """A file's one JSON document: an object, or a List of them (`items` holds no further `items`)."""

    items: list[Item] | UnsetType | None = UNSET


# The deepest path, in maps and lists: the document, items, an item, metadata, managedFields, an
# entry, and the 13 levels of its fieldsV1. tests/cluster/test_decode_fast_path.py computes it from the
# types above.
SCHEMA_DEPTH = 19

_DECODER = msgspec.json.Decoder(Document)


def decode_typed(text: str | bytes) -> Document | None:
    """The document, if every field is one of the schema's with a value of its type; else None
    (the caller decodes it the general way)."""
    try:
        document: Document = _DECODER.decode(text)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    return document


def split_list(document: Document) -> tuple[dict[str, Any], list[Item] | None]:
    """(the document as plain dicts, without `items` if it is a List; the List's items, or None
    when it is not a List). Takes `items` out of `document`."""
    items = document.items
    document.items = UNSET
    head: dict[str, Any] = msgspec.to_builtins(document)
    kind = head.get("kind")
    if isinstance(kind, str) and kind.endswith("List"):
        return head, items or []
    if items is not UNSET:
        head["items"] = msgspec.to_builtins(items)
    return head, None


def as_plain(item: Item) -> dict[str, Any]:
    """An item as the plain dicts `msgspec.json.decode` gives for its text: what the dict parsers read."""
    plain: dict[str, Any] = msgspec.to_builtins(item)
    return plain


def decode_list(body: bytes | str) -> tuple[dict[str, Any], list[Item]] | None:
    """An API server's list response as (the list without `items`, as plain dicts; its items as
    structs), or None when the body is not a List within this schema (a field it does not know,
    a value of another type, not JSON, not a `...List`): the caller then
    decodes the body the general way (`sources.api.decode_body`) and reads plain dicts.

    The items are what `ClusterState.apply` (and `kind_of`, `object_ref`) take as well as dicts.
    List items carry no `kind` (the list does): an item's `kind` is UNSET unless the body had
    one, and the caller sets it (`item.kind = "Service"`) as it does `setdefault` on a dict.
    `as_plain(item)` gives any item as the dicts the general decoder would have given.
    """
    with paused_gc(freeze=True):  # see cluster.bulk: a million new objects, none of them garbage
        document = decode_typed(body)
        if document is None:
            return None
        head, items = split_list(document)
    if items is None:
        return None
    return head, items


def iter_plain(items: list[Item]) -> Iterator[dict[str, Any]]:
    """Each item as the plain dicts `msgspec.json.decode` gives, one at a time, each item's struct
    released as its dicts are made: at no point are all structs and all dicts alive at once."""
    for index, item in enumerate(items):
        items[index] = RELEASED
        yield msgspec.to_builtins(item)


RELEASED = Item()  # what a consumed item's slot holds

"""Typed reads of fields out of raw Kubernetes JSON, raising ObjectError that names the field.

Every object kind parses through a `Fields` reader so that messages look the same everywhere:
`Service default/web: spec.ports[0].port: 70000 is out of range 1-65535`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kubeproxy.cluster.addresses import (
    AddressError,
    CheckedIP,
    CheckedNet,
    endpoint_ip,
    non_special_ip,
    source_range,
    valid_ip,
)
from kubeproxy.cluster.errors import ObjectError
from kubeproxy.cluster.schema import Item, Metadata, as_plain
from kubeproxy.cluster.validation import (
    ANNOTATIONS_MAX_BYTES,
    display,
    label_value,
    qualified_name,
    show,
)

# Addresses from configuration (flags, the node's own); object addresses are `CheckedIP`.
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_Checked = TypeVar("_Checked", CheckedIP, CheckedNet)


@dataclass(frozen=True, slots=True)
class Fields:
    """A reader positioned at `path` inside object `kind ref`."""

    kind: str
    ref: str
    data: Mapping[str, Any]
    path: str = ""

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, problem: str) -> ObjectError:
        return ObjectError(self.kind, self.ref, self._name(key), problem)

    def _get(self, key: str, types: type | tuple[type, ...], what: str) -> Any:
        value = self.data.get(key)
        # The common case first (this runs 20+ times per object): exactly the type asked for.
        # bool is not int here (type(True) is bool), so true for a number still takes the checks.
        if type(value) is types or value is None:
            return value
        # bool is an int in Python; Kubernetes never accepts true for a number.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
            raise self.error(key, f"expected {what}, got {type(value).__name__} {show(value)}")
        return value

    def text(self, key: str, default: str = "") -> str:
        value = self._get(key, str, "a string")
        return default if value is None else value

    def required_str(self, key: str) -> str:
        value = self.text(key)
        if not value:
            raise self.error(key, "required field is missing")
        return value

    def flag(self, key: str) -> bool | None:
        value: bool | None = self._get(key, bool, "true or false")
        return value

    def integer(self, key: str, default: int = 0) -> int:
        value: int | None = self._get(key, int, "an integer")
        return default if value is None else value

    def port(self, key: str, *, required: bool) -> int:
        value: int | None = self._get(key, int, "an integer")
        if value is None:
            if required:
                raise self.error(key, "required field is missing")
            return 0
        if not 1 <= value <= 65535:
            raise self.error(key, f"{value} is out of range 1-65535")
        return value

    def map(self, key: str) -> Fields:
        value = self._get(key, dict, "an object")
        return Fields(self.kind, self.ref, value or {}, self._name(key))

    def items(self, key: str) -> list[Any]:
        value = self._get(key, list, "a list")
        return value or []

    def maps(self, key: str) -> list[Fields]:
        out = []
        for i, item in enumerate(self.items(key)):
            if not isinstance(item, dict):
                raise self.error(f"{key}[{i}]", f"expected an object, got {type(item).__name__} {show(item)}")
            out.append(self.entry(key, i, item))
        return out

    def entry(self, key: str, index: int, item: Mapping[str, Any]) -> Fields:
        """The reader of item `index` of the list of objects at `key` (as `maps` gives it)."""
        return Fields(self.kind, self.ref, item, f"{self._name(key)}[{index}]")

    def strs(self, key: str) -> list[str]:
        items = self.items(key)
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise self.error(f"{key}[{i}]", f"expected a string, got {type(item).__name__} {show(item)}")
        return items

    def check(self, key: str, problem: str | None) -> None:
        """Raise the ObjectError for `key` if a validation check found a problem."""
        if problem is not None:
            raise self.error(key, problem)

    def str_map(self, key: str) -> dict[str, str]:
        value = self._get(key, dict, "an object")
        if not value:
            return {}
        out = {}
        for k, v in value.items():
            if type(k) is not str or type(v) is not str:
                k, v = self._text_pair(key, k, v)
            out[k] = v
        return out

    def _text_pair(self, key: str, k: Any, v: Any) -> tuple[str, str]:
        # A number or true written unquoted in YAML is still meant as text; a list or map is
        # not, and turning it into text could expand a YAML alias bomb.
        if isinstance(k, (dict, list)) or isinstance(v, (dict, list)):
            raise self.error(key, f"expected strings, got {show(k)}: {show(v)}")
        return str(k), "" if v is None else str(v)  # null is Go's empty string

    def labels(self, key: str) -> dict[str, str]:
        """A label map, keys and values checked as the API server does."""
        value = self._get(key, dict, "an object")
        if not value:
            return {}
        out = {}
        for k, v in value.items():  # one pass: this runs for every object at start
            if type(k) is not str or type(v) is not str:
                k, v = self._text_pair(key, k, v)
            if (problem := qualified_name(k)) is not None:
                raise self.error(key, problem)
            if v and (problem := label_value(v)) is not None:
                raise self.error(f"{key}[{display(k)}]", problem)
            out[k] = v
        return out

    def annotations(self, key: str) -> dict[str, str]:
        """An annotation map: keys checked as the API server does (values are free text), size bounded."""
        annotations = self.str_map(key)
        size = 0
        for k, v in annotations.items():
            # Upstream checks the lowercased key: annotation keys may hold uppercase prefixes.
            self.check(key, qualified_name(k.lower()))
            size += len(k) + len(v)
        if size > ANNOTATIONS_MAX_BYTES:
            raise self.error(key, f"{size} bytes, more than the {ANNOTATIONS_MAX_BYTES} the API server allows")
        return annotations

    def _address(self, key: str, value: str, gate: Callable[[str], _Checked]) -> _Checked:
        try:
            return gate(value)
        except AddressError as problem:
            raise self.error(key, f"{show(value)} {problem}") from None

    def ip(self, key: str, value: str) -> CheckedIP:
        """A legacy IP field that may hold any address (clusterIPs, load-balancer ingress, Node addresses)."""
        return self._address(key, value, valid_ip)

    def ips(self, key: str) -> list[CheckedIP]:
        return [self.ip(f"{key}[{i}]", s) for i, s in enumerate(self.strs(key))]

    def non_special_ips(self, key: str) -> list[CheckedIP]:
        """externalIPs: addresses traffic may be sent to (not loopback, link-local, unspecified)."""
        return [self._address(f"{key}[{i}]", s, non_special_ip) for i, s in enumerate(self.strs(key))]

    def endpoint_ips(self, key: str, address_type: str) -> list[CheckedIP]:
        """An endpoint's addresses: non-special and of the slice's address family."""
        return [
            self._address(f"{key}[{i}]", s, lambda text: endpoint_ip(text, address_type))
            for i, s in enumerate(self.strs(key))
        ]

    def cidrs(self, key: str) -> list[CheckedNet]:
        """loadBalancerSourceRanges and podCIDRs (upstream trims spaces around source ranges)."""
        return [self._address(f"{key}[{i}]", raw, source_range) for i, raw in enumerate(self.strs(key))]

    def cidrs_of_one(self, key: str) -> list[CheckedNet]:
        return [self._address(key, self.text(key), source_range)]

    def enum(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.text(key)
        if not value:
            return default
        if value not in allowed:
            raise self.error(key, f"{show(value)} is not one of {', '.join(allowed)}")
        return value


def parse_ip_sloppy(text: str) -> CheckedIP:
    """Any address a legacy IP field may hold (see `addresses.valid_ip`); ValueError if none."""
    return valid_ip(text)


def parse_cidr_sloppy(text: str) -> CheckedNet:
    """A CIDR with upstream's tolerance: surrounding spaces, leading zeros, host bits set."""
    return source_range(text)


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


def object_ref(kind: str, obj: Mapping[str, Any] | Item, *, namespaced: bool = True) -> tuple[str, str, str]:
    """(namespace, name, "ns/name") of a raw object (plain dicts or a `schema.Item`), or ObjectError
    if metadata is unusable."""
    if isinstance(obj, Item):
        meta_struct = obj.metadata
        if isinstance(meta_struct, Metadata):
            name, namespace = meta_struct.name, meta_struct.namespace
            if isinstance(name, str) and name and not namespaced:
                return "", name, display(name)
            if isinstance(name, str) and name:
                namespace = namespace or "default"
                return namespace, name, f"{display(namespace)}/{display(name)}"
        obj = as_plain(obj)  # the dict reading below words the problem
    # The ref goes into every message about the object: a hostile name is shown quoted and short,
    # so that a newline in it cannot forge a log line. Whether the name is valid is checked by the
    # parser of each kind (the rules differ); here only what a key needs.
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise ObjectError(kind, "<unnamed>", "metadata", "required field is missing")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        problem = "required field is missing" if not name else f"expected a string, got {type(name).__name__} {show(name)}"
        raise ObjectError(kind, "<unnamed>", "metadata.name", problem)
    if not namespaced:
        return "", name, display(name)
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        problem = f"expected a string, got {type(namespace).__name__} {show(namespace)}"
        raise ObjectError(kind, display(name), "metadata.namespace", problem)
    return namespace, name, f"{display(namespace)}/{display(name)}"

"""The API server's rules for names, labels and port ranges, for objects no API server has seen.

A manifest file was never validated: without these checks a Service named `a"\\n-A INPUT ...`
reaches rule text. The rules and length limits are upstream's (apimachinery's
IsDNS1123Label / IsDNS1123Subdomain / IsDNS1035Label / IsQualifiedName / IsValidLabelValue, and
the Service and EndpointSlice validation built on them), so nothing the API server accepts is
refused here. Each check returns the problem as text, or None: the caller names the object and
field (`Service ns/a: metadata.name: "A" is not a valid DNS-1035 label (...)`).

Checks run on every object at start (20k objects within the decode budget), so the patterns are
compiled once and a valid value costs one `fullmatch`.
"""

from __future__ import annotations

import re
import reprlib
from dataclasses import dataclass
from typing import Any

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
DNS1035_LABEL_MAX = 63
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
ANNOTATIONS_MAX_BYTES = 256 * 1024  # upstream's TotalAnnotationSizeLimitB

# Service node ports are allocated from the API server's --service-node-port-range.
DEFAULT_NODE_PORT_RANGE = (30000, 32767)

# ASCII only: `[a-z]` in a str pattern never matches other scripts, and there is no `\d` or `\w`
# (both match non-ASCII digits and letters).
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_DNS1035_LABEL = re.compile("[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME = re.compile("([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
# A whole qualified name in one match, for the common case of at most 63 characters (then neither
# part can exceed its limit): `prefix/name` costs one regex call, not a split and two.
_SHORT_QUALIFIED_NAME = re.compile(rf"({_LABEL}(\.{_LABEL})*/)?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_PLAIN = re.compile("[A-Za-z0-9._/-]{1,253}")  # shown as is in messages; anything else is quoted

_DNS1123_LABEL_RULE = "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters"
_DNS1123_SUBDOMAIN_RULE = (
    "lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit, "
    "at most 253 characters"
)
_DNS1035_LABEL_RULE = (
    "lowercase letters, digits and '-', starting with a letter and ending with a letter or digit, at most 63 characters"
)
_QUALIFIED_NAME_RULE = (
    "an optional DNS subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.', "
    "starting and ending with a letter or digit"
)
_LABEL_VALUE_RULE = "empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"


@dataclass(frozen=True, slots=True)
class ParseOptions:
    """What an object is checked against beyond the API server's static rules.

    `node_port_range` is the API server's --service-node-port-range (inclusive): Services whose
    nodePort or healthCheckNodePort lies outside are refused. None skips the check: for objects an
    API server already allocated from a range we do not know, and for upstream's own test objects
    (node port 3001). `options_for` chooses for the command line.
    `relaxed_service_names`: upstream's RelaxedServiceNameValidation gate, under which Service
    names are DNS-1123 labels (they may start with a digit).
    """

    node_port_range: tuple[int, int] | None = None
    relaxed_service_names: bool = False


def options_for(*, node_port_range: str = "", from_api_server: bool, relaxed_service_names: bool = False) -> ParseOptions:
    """The options for one source. ValueError if `node_port_range` is not a range.

    Objects from manifest files were never allocated a node port by an API server: they are
    checked against `node_port_range`, by default upstream's 30000-32767. An API server's objects
    are only checked when the range is given explicitly (its own range may be wider).
    """
    if node_port_range:
        port_range: tuple[int, int] | None = parse_port_range(node_port_range)
    else:
        port_range = None if from_api_server else DEFAULT_NODE_PORT_RANGE
    return ParseOptions(node_port_range=port_range, relaxed_service_names=relaxed_service_names)


def parse_port_range(text: str) -> tuple[int, int]:
    """`30000-32767` (upstream's --service-node-port-range syntax; `30000+2767` too) -> (30000, 32767)."""
    raw = text.strip()
    try:
        if "+" in raw:
            base, _, size = raw.partition("+")
            low, high = int(base), int(base) + int(size)
        else:
            low_text, sep, high_text = raw.partition("-")
            low = int(low_text)
            high = int(high_text) if sep else low
    except ValueError:
        raise ValueError(f"{text!r} is not a port range like 30000-32767") from None
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"{text!r} is not a port range within 1-65535")
    return low, high


def show(value: Any) -> str:
    """`value` for a message: quoted, and short whatever its size or depth (a 64 KB name, an alias bomb)."""
    return _SHORT.repr(value)


def _short_repr() -> reprlib.Repr:
    short = reprlib.Repr()
    short.maxstring = 80
    short.maxother = 80
    short.maxlong = 40
    short.maxlevel = 2
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 4
    return short


_SHORT = _short_repr()  # immutable after creation: a formatting table, not state


def display(name: str) -> str:
    """A name as it appears in `Kind ns/name` of a message: bare when plain, else quoted and short."""
    return name if _PLAIN.fullmatch(name) else show(name)


def dns1123_label(value: str) -> str | None:
    if len(value) <= DNS1123_LABEL_MAX and _DNS1123_LABEL.fullmatch(value):
        return None
    return f"{show(value)} is not a valid DNS-1123 label ({_DNS1123_LABEL_RULE})"


def dns1123_subdomain(value: str) -> str | None:
    if len(value) <= DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(value):
        return None
    return f"{show(value)} is not a valid DNS-1123 subdomain ({_DNS1123_SUBDOMAIN_RULE})"


def dns1035_label(value: str) -> str | None:
    if len(value) <= DNS1035_LABEL_MAX and _DNS1035_LABEL.fullmatch(value):
        return None
    return f"{show(value)} is not a valid DNS-1035 label ({_DNS1035_LABEL_RULE})"


def qualified_name(value: str) -> str | None:
    """A label or annotation key: `name` or `prefix/name` (upstream's IsQualifiedName)."""
    if len(value) <= QUALIFIED_NAME_MAX and _SHORT_QUALIFIED_NAME.fullmatch(value):
        return None
    prefix, slash, name = value.rpartition("/")
    if (
        len(name) <= QUALIFIED_NAME_MAX
        and _QUALIFIED_NAME.fullmatch(name)
        and (not slash or (len(prefix) <= DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(prefix)))
    ):
        return None
    return f"{show(value)} is not a valid qualified name ({_QUALIFIED_NAME_RULE})"


def label_value(value: str) -> str | None:
    if not value or (len(value) <= LABEL_VALUE_MAX and _QUALIFIED_NAME.fullmatch(value)):
        return None
    return f"{show(value)} is not a valid label value ({_LABEL_VALUE_RULE})"

"""Field and label selectors: `fieldSelector`/`labelSelector` query strings on lists and watches,
and the `metav1.LabelSelector` objects a DaemonSet carries."""

from __future__ import annotations

from dataclasses import dataclass

from kubeproxy.lab.apiserver.status_errors import JSON, ApiError

# Field labels the real server takes beyond metadata.name and metadata.namespace, by kind
# (k8s.io/kubernetes v1.37.2 pkg/apis/core/v1/conversion.go, AddFieldLabelConversionsForService).
FIELD_LABELS: dict[str, tuple[str, ...]] = {"Service": ("spec.clusterIP", "spec.type")}


@dataclass(frozen=True)
class Selector:
    """Field and label selectors as the real server parses them (the subset we need).

    Fields: `metadata.name`, `metadata.namespace` and the kind's own (`FIELD_LABELS`) with `=`,
    `==`, `!=`.
    Labels: `key`, `!key`, `key=value`, `key==value`, `key!=value`, comma-separated (AND).
    """

    fields: tuple[tuple[str, str, str], ...] = ()
    labels: tuple[tuple[str, str, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.fields and not self.labels

    @classmethod
    def parse(cls, field_selector: str, label_selector: str, kind: str = "") -> Selector:
        return cls(_parse_terms(field_selector, "field", kind), _parse_terms(label_selector, "label"))

    def matches(self, obj: JSON) -> bool:
        meta = obj.get("metadata") or {}
        for key, op, value in self.fields:
            if (_field_value(obj, key) == value) != (op == "="):
                return False
        labels = meta.get("labels") or {}
        for key, op, value in self.labels:
            if op == "exists" and key not in labels:
                return False
            if op == "!exists" and key in labels:
                return False
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
        return True


def _field_value(obj: JSON, path: str) -> str:
    """A field selector's view of a field: its value as text, "" when absent."""
    value: object = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value)


def _parse_terms(text: str, what: str, kind: str = "") -> tuple[tuple[str, str, str], ...]:
    terms = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append((key.strip(), "!=", value.strip()))
        elif "=" in raw:
            key, value = raw.split("==", 1) if "==" in raw else raw.split("=", 1)
            terms.append((key.strip(), "=", value.strip()))
        elif what == "label":
            terms.append((raw.lstrip("!").strip(), "!exists" if raw.startswith("!") else "exists", ""))
        else:
            raise ApiError(400, "BadRequest", f"invalid {what} selector {raw!r}")
        if what == "field" and terms[-1][0] not in ("metadata.name", "metadata.namespace", *FIELD_LABELS.get(kind, ())):
            raise ApiError(400, "BadRequest", f"field label not supported: {terms[-1][0]}")
    return tuple(terms)


def selector_matches(selector: JSON, labels: JSON) -> bool:
    """A metav1.LabelSelector (matchLabels and matchExpressions) against a label set."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True

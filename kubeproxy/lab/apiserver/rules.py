"""The rules the real server enforces on the kinds `kubectl apply -f deploy/` creates (DaemonSet,
ConfigMap, RBAC), beyond what the schema says: each check returns every cause it finds, as
upstream's validation does, so that one 422 lists them all."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubeproxy.lab.apiserver.selectors import selector_matches
from kubeproxy.lab.apiserver.status_errors import JSON

if TYPE_CHECKING:
    from kubeproxy.lab.apiserver.resources import ResourceType

RBAC_GROUP = "rbac.authorization.k8s.io"


@dataclass(frozen=True)
class Cause:
    """One reason an object is invalid, as a Status cause: `field: message`."""

    field: str
    reason: str  # FieldValueRequired, FieldValueInvalid, FieldValueNotSupported, ...: upstream's CauseType
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def required(path: str, detail: str = "") -> Cause:
    return Cause(path, "FieldValueRequired", f"Required value: {detail}" if detail else "Required value")


def invalid(path: str, value: Any, why: str) -> Cause:
    return Cause(path, "FieldValueInvalid", f"Invalid value: {json.dumps(value)}: {why}")


def duplicate(path: str, value: Any) -> Cause:
    return Cause(path, "FieldValueDuplicate", f"Duplicate value: {json.dumps(value)}")


def unsupported(path: str, value: Any, supported: tuple[str, ...]) -> Cause:
    listed = ", ".join(json.dumps(s) for s in supported)
    return Cause(path, "FieldValueNotSupported", f"Unsupported value: {json.dumps(value)}: supported values: {listed}")


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
_ALNUM_ENDS = "and must start and end with an alphanumeric character"
_SUBDOMAIN_RULE = f"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', {_ALNUM_ENDS}"
_LABEL_KEY_RULE = f"name part must consist of alphanumeric characters, '-', '_' or '.', {_ALNUM_ENDS}"
_LABEL_VALUE_RULE = f"a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', {_ALNUM_ENDS}"
_ENV_NAME_RULE = (
    "a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', "
    "and must not start with a digit"
)
_CONFIG_KEY_RULE = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"


def check_metadata(rt: ResourceType, meta: JSON, path: str) -> list[Cause]:
    causes: list[Cause] = []
    name = meta.get("name")
    if name:
        if rt.group == RBAC_GROUP:
            # RBAC names are path segments (system:node-proxier is valid), not DNS names.
            if name in (".", "..") or "/" in name or "%" in name:
                causes.append(invalid(f"{path}.name", name, "may not be '.' or '..' and may not contain '/' or '%'"))
        elif len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
            causes.append(invalid(f"{path}.name", name, _SUBDOMAIN_RULE))
    causes += _check_labels(meta.get("labels") or {}, f"{path}.labels")
    return causes


def _check_labels(labels: JSON, path: str) -> list[Cause]:
    causes = []
    for key, value in labels.items():
        prefix, _, label = str(key).rpartition("/")
        if (prefix and not _DNS_SUBDOMAIN.fullmatch(prefix)) or len(label) > 63 or not _LABEL_NAME.fullmatch(label):
            causes.append(invalid(path, key, _LABEL_KEY_RULE))
        if not isinstance(value, str) or len(value) > 63 or (value and not _LABEL_NAME.fullmatch(value)):
            causes.append(invalid(f"{path}[{key}]", value, _LABEL_VALUE_RULE))
    return causes


# The downward API fields a container's env may reference (upstream's validEnvDownwardAPIFieldPathExpressions).
_ENV_FIELD_PATHS = (
    "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
    "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs",
)  # fmt: skip
_ENV_FIELD_MAP_KEY = re.compile(r"metadata\.(labels|annotations)\['[^']+'\]")


def check_daemon_set(obj: JSON, old: JSON | None) -> list[Cause]:
    spec = obj.get("spec") or {}
    causes: list[Cause] = []
    selector = spec.get("selector")
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    if selector is not None:
        if not selector.get("matchLabels") and not selector.get("matchExpressions"):
            causes.append(invalid("spec.selector", selector, "empty selector is invalid for daemonset"))
        elif not selector_matches(selector, labels):
            causes.append(invalid("spec.template.metadata.labels", labels, "`selector` does not match template `labels`"))
        causes += _check_labels(selector.get("matchLabels") or {}, "spec.selector.matchLabels")
        operators = ("In", "NotIn", "Exists", "DoesNotExist")
        for n, expr in enumerate(selector.get("matchExpressions") or []):
            if expr.get("operator") not in operators:
                causes.append(unsupported(f"spec.selector.matchExpressions[{n}].operator", expr.get("operator"), operators))
    if old is not None and selector != (old.get("spec") or {}).get("selector"):
        causes.append(invalid("spec.selector", selector, "field is immutable"))
    causes += _check_labels(labels, "spec.template.metadata.labels")
    strategy = (spec.get("updateStrategy") or {}).get("type")
    if strategy is not None and strategy not in ("OnDelete", "RollingUpdate"):
        causes.append(unsupported("spec.updateStrategy.type", strategy, ("OnDelete", "RollingUpdate")))
    if spec.get("template") is not None:
        causes += _check_pod_spec((spec["template"].get("spec") or {}), "spec.template.spec")
    return causes


def _check_pod_spec(pod: JSON, path: str) -> list[Cause]:
    causes: list[Cause] = []
    restart = pod.get("restartPolicy")
    if restart is not None and restart != "Always":
        causes.append(unsupported(f"{path}.restartPolicy", restart, ("Always",)))
    volumes: set[str] = set()
    for n, volume in enumerate(pod.get("volumes") or []):
        if volume.get("name") in volumes:
            causes.append(duplicate(f"{path}.volumes[{n}].name", volume.get("name")))
        volumes.add(volume.get("name"))
        sources = [k for k in volume if k != "name"]
        if not sources:
            causes.append(required(f"{path}.volumes[{n}]", "must specify a volume type"))
        elif len(sources) > 1:
            causes.append(
                Cause(f"{path}.volumes[{n}]", "FieldValueForbidden", "Forbidden: may not specify more than 1 volume type")
            )
    if not pod.get("containers"):
        causes.append(required(f"{path}.containers"))
    names: set[str] = set()
    for group in ("initContainers", "containers"):
        for n, container in enumerate(pod.get(group) or []):
            where = f"{path}.{group}[{n}]"
            if container.get("name") in names:
                causes.append(duplicate(f"{where}.name", container.get("name")))
            names.add(container.get("name"))
            causes += _check_container(container, where, volumes)
    return causes


def _check_container(container: JSON, where: str, volumes: set[str]) -> list[Cause]:
    causes: list[Cause] = []
    if not container.get("image"):
        causes.append(required(f"{where}.image"))
    for m, mount in enumerate(container.get("volumeMounts") or []):
        if mount.get("name") not in volumes:
            causes.append(
                Cause(f"{where}.volumeMounts[{m}].name", "FieldValueNotFound", f"Not found: {json.dumps(mount.get('name'))}")
            )
    for m, env in enumerate(container.get("env") or []):
        if not _ENV_NAME.fullmatch(env.get("name") or ""):
            causes.append(invalid(f"{where}.env[{m}].name", env.get("name"), _ENV_NAME_RULE))
        field_path = ((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        if field_path is not None and field_path not in _ENV_FIELD_PATHS and not _ENV_FIELD_MAP_KEY.fullmatch(field_path):
            causes.append(unsupported(f"{where}.env[{m}].valueFrom.fieldRef.fieldPath", field_path, _ENV_FIELD_PATHS))
    return causes


def check_policy_rules(obj: JSON, old: JSON | None) -> list[Cause]:
    causes = []
    for n, rule in enumerate(obj.get("rules") or []):
        where = f"rules[{n}]"
        if not rule.get("verbs"):
            causes.append(required(f"{where}.verbs", "verbs must contain at least one value"))
        if rule.get("nonResourceURLs"):
            if rule.get("apiGroups") or rule.get("resources"):
                causes.append(
                    invalid(
                        f"{where}.nonResourceURLs",
                        rule["nonResourceURLs"],
                        "rules cannot apply to both regular resources and non-resource URLs",
                    )
                )
            continue
        if not rule.get("apiGroups"):
            causes.append(required(f"{where}.apiGroups", "resource rules must supply at least one api group"))
        if not rule.get("resources"):
            causes.append(required(f"{where}.resources", "resource rules must supply at least one resource"))
    return causes


def check_cluster_role_binding(obj: JSON, old: JSON | None) -> list[Cause]:
    causes = []
    ref = obj.get("roleRef") or {}
    if ref.get("apiGroup") not in (None, RBAC_GROUP):
        causes.append(unsupported("roleRef.apiGroup", ref["apiGroup"], (RBAC_GROUP,)))
    if ref.get("kind") not in (None, "ClusterRole"):
        causes.append(unsupported("roleRef.kind", ref["kind"], ("ClusterRole",)))
    if old is not None and ref != old.get("roleRef"):
        causes.append(invalid("roleRef", ref, "cannot change roleRef"))
    for n, subject in enumerate(obj.get("subjects") or []):
        where, kind, group = f"subjects[{n}]", subject.get("kind"), subject.get("apiGroup") or ""
        if kind == "ServiceAccount":
            if group:
                causes.append(unsupported(f"{where}.apiGroup", group, ("",)))
            if not subject.get("namespace"):
                causes.append(required(f"{where}.namespace"))
        elif kind in ("User", "Group"):
            if group != RBAC_GROUP:
                causes.append(unsupported(f"{where}.apiGroup", group, (RBAC_GROUP,)))
        else:
            causes.append(unsupported(f"{where}.kind", kind, ("ServiceAccount", "User", "Group")))
    return causes


def check_config_map(obj: JSON, old: JSON | None) -> list[Cause]:
    causes = []
    data, binary = obj.get("data") or {}, obj.get("binaryData") or {}
    for section, values in (("data", data), ("binaryData", binary)):
        for key in values:
            if len(key) > 253 or not _CONFIG_KEY.fullmatch(key) or key in (".", ".."):
                causes.append(invalid(f"{section}[{key}]", key, _CONFIG_KEY_RULE))
            if section == "binaryData" and key in data:
                causes.append(duplicate(f"binaryData[{key}]", key))
    return causes

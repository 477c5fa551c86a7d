"""The metrics port's debugging pages, as upstream kube-proxy v1.37.2 serves them.

- `/configz`: the configuration in effect as upstream's v1alpha1 KubeProxyConfiguration JSON,
  under the key `kubeproxy.config.k8s.io` (always on, as upstream).
- `/flagz` (gate ComponentFlagz): every command-line flag and its value as given, or its default.
- `/statusz` (gate ComponentStatusz): start time, uptime, versions and the port's paths.

`/flagz` and `/statusz` answer plain text by default, or, when Accept asks for it
(`application/json;as=Flagz;v=v1beta1;g=config.k8s.io`, likewise `application/yaml`, and the
deprecated `v1alpha1` with a Warning header), a structured document; any other Accept is a 406
with a Status. The shapes are recorded from upstream's binary in tests/fixtures/upstream_operator.
kubeproxy has no Go build: statusz's Go version is empty, as in `kubernetes_build_info`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubeproxy.cluster.duration import format_go_duration
from kubeproxy.model.features import gate_enabled
from kubeproxy.model.proxy_config import ProxyConfig
from kubeproxy.proxy.config import to_kube_proxy_configuration
from kubeproxy.proxy.flags import FLAGS, HELP_DEFAULTS
from kubeproxy.proxy.http import Handler, Response
from kubeproxy.runtime.version import VersionInfo

COMPONENT = "kube-proxy"
CONFIGZ_KEY = "kubeproxy.config.k8s.io"
ZPAGES_GROUP = "config.k8s.io"
ZPAGES_VERSIONS = ("v1beta1", "v1alpha1")  # the first is current; the other answers with a Warning
TEXT = "text/plain; charset=utf-8"
WARNING = ("Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for "
           "debugging purposes only.")
# The metrics server's own paths, listed by statusz beside the pages of this module.
METRICS_SERVER_PATHS = ("/healthz", "/metrics", "/proxyMode")

# Flag defaults as pflag shows them, where they are neither the type's zero value nor in --help's
# list (flags.HELP_DEFAULTS): upstream's /flagz shows these.
_FLAGZ_DEFAULTS = {
    "detect-local-mode": "ClusterCIDR",
    "healthz-port": "10256",
    "metrics-port": "10249",
    "proxy-mode": "iptables",
    "log-json-info-buffer-size": "0",
    "log-text-info-buffer-size": "0",
    "version": "false",
    # kubeproxy's own flags
    "snat-watch-threshold": "0.6",
    "snat-watch-max-entries": "20000",
    "udp-timeout": "250ms",
}
_ZERO = {"bool": "false", "int": "0", "float": "0", "duration": "0s", "strings": "[]", "level": "0"}


def _flag_text(kind: str, value: Any) -> str:
    """A parsed flag value as pflag's String() writes it."""
    if kind == "bool":
        return "true" if value else "false"
    if kind == "duration":
        return format_go_duration(value)
    if kind == "strings":
        return "[" + ",".join(value) + "]"
    if kind == "mapbool":
        return ",".join(f"{name}={'true' if on else 'false'}" for name, on in sorted(value.items()))
    if kind == "float":
        return f"{value:g}"
    return str(value)


def flag_values(given: Mapping[str, Any]) -> dict[str, str]:
    """Every flag of the command line (flags.FLAGS), by name, with its value as given or its default."""
    out: dict[str, str] = {}
    for flag in sorted(FLAGS, key=lambda f: f.name):
        if flag.name in given:
            out[flag.name] = _flag_text(flag.kind, given[flag.name])
        else:
            default = HELP_DEFAULTS.get(flag.name) or _FLAGZ_DEFAULTS.get(flag.name) or _ZERO.get(flag.kind, "")
            out[flag.name] = default.strip('"')
    return out


def _media_ranges(accept: str) -> list[tuple[str, dict[str, str]]]:
    """Accept's media ranges, most preferred first (by q, then as written); q=0 ones dropped."""
    ranges: list[tuple[float, int, str, dict[str, str]]] = []
    for index, item in enumerate(accept.split(",")):
        media, *raw_params = (part.strip() for part in item.split(";"))
        params = {}
        for param in raw_params:
            key, _, value = param.partition("=")
            params[key.strip().lower()] = value.strip()
        try:
            q = float(params.pop("q", "1"))
        except ValueError:
            q = 0.0
        if media and q > 0:
            ranges.append((-q, index, media.lower(), params))
    return [(media, params) for _, _, media, params in sorted(ranges)]


def negotiate(accept: str, kind: str) -> tuple[str, str] | None:
    """("text", "") or (json|yaml, version) for an Accept header; None when nothing acceptable."""
    if not accept.strip():
        return "text", ""
    for media, params in _media_ranges(accept):
        if media in ("*/*", "text/*", "text/plain"):
            return "text", ""
        structured = media in ("application/json", "application/yaml") and params.get("as") == kind
        if structured and params.get("g") == ZPAGES_GROUP and params.get("v") in ZPAGES_VERSIONS:
            return media.split("/")[1], params["v"]
    return None


def _not_acceptable() -> Response:
    status = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "only the following media types are accepted: application/json, application/yaml, text/plain",
        "reason": "NotAcceptable",
        "code": 406,
    }
    return Response(406, {"Content-Type": "application/json"}, json.dumps(status, indent=2).encode())


def _structured(kind: str, version: str, fmt: str, body: dict[str, Any]) -> Response:
    doc = {"kind": kind, "apiVersion": f"{ZPAGES_GROUP}/{version}", "metadata": {"name": COMPONENT}, **body}
    headers = {"Content-Type": f"application/{fmt};g={ZPAGES_GROUP};v={version};as={kind}"}
    if version != ZPAGES_VERSIONS[0]:
        headers["Warning"] = (f'299 - "This version of the {kind.lower()} endpoint is deprecated. '
                              'Please use a newer version."')
    if fmt == "json":
        text = json.dumps(doc, indent=2)
    else:
        from kubeproxy.proxy import goyaml  # YAML only when asked for: start-up does without it

        text = goyaml.dump(doc)
    return Response(200, headers, text.encode())


def _uptime(seconds: int) -> str:
    return f"{seconds // 3600} hr {seconds // 60 % 60:02d} min {seconds % 60:02d} sec"


@dataclass(frozen=True)
class ZPages:
    """The pages of one proxy: its configuration, its command line, and when it started."""

    cfg: ProxyConfig
    flags: Mapping[str, str]  # flag_values() of the command line
    started: float  # wall-clock seconds
    clock: Callable[[], float] = time.time
    version: VersionInfo = field(default_factory=VersionInfo)

    def routes(self) -> dict[str, Handler]:
        """The pages the metrics server adds to its own, as the gates say."""
        pages: dict[str, Handler] = {"/configz": self.configz}
        if gate_enabled(self.cfg.feature_gates, "ComponentFlagz"):
            pages["/flagz"] = self.flagz
        if gate_enabled(self.cfg.feature_gates, "ComponentStatusz"):
            pages["/statusz"] = self.statusz
        return pages

    def paths(self) -> list[str]:
        """What statusz lists: the metrics server's paths, statusz itself left out."""
        return sorted({*METRICS_SERVER_PATHS, *self.routes()} - {"/statusz"})

    def configz(self, method: str, path: str, headers: Mapping[str, str]) -> Response:
        body = json.dumps({CONFIGZ_KEY: to_kube_proxy_configuration(self.cfg)}, separators=(",", ":"))
        return Response(200, {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}, body.encode())

    def flagz(self, method: str, path: str, headers: Mapping[str, str]) -> Response:
        chosen = negotiate(headers.get("accept", ""), "Flagz")
        if chosen is None:
            return _not_acceptable()
        fmt, version = chosen
        if fmt != "text":
            return _structured("Flagz", version, fmt, {"flags": dict(self.flags)})
        lines = ["", f"{COMPONENT} flagz", WARNING, *(f"{name}:{value}" for name, value in self.flags.items())]
        return Response(200, {"Content-Type": TEXT}, ("\n".join(lines) + "\n").encode())

    def statusz(self, method: str, path: str, headers: Mapping[str, str]) -> Response:
        chosen = negotiate(headers.get("accept", ""), "Statusz")
        if chosen is None:
            return _not_acceptable()
        up = max(0, int(self.clock() - self.started))
        info = self.version.fields()
        binary = info["GitVersion"].lstrip("v")
        emulation = f"{info['Major']}.{info['Minor']}"
        fmt, version = chosen
        if fmt != "text":
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started))
            return _structured("Statusz", version, fmt, {
                "startTime": started, "uptimeSeconds": up, "goVersion": info["GoVersion"],
                "binaryVersion": binary, "emulationVersion": emulation, "paths": self.paths(),
            })  # fmt: skip
        lines = [
            "",
            f"{COMPONENT} statusz",
            WARNING,
            "",
            f"Started  {time.strftime('%a %b %e %H:%M:%S %Z %Y', time.localtime(self.started))}",
            f"Up  {_uptime(up)}",
            f"Go version  {info['GoVersion']}",
            f"Binary version  {binary}",
            f"Emulation version  {emulation}",
            f"Paths  {' '.join(self.paths())}",
        ]
        return Response(200, {"Content-Type": TEXT}, ("\n".join(lines) + "\n").encode())

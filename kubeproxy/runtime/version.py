"""Which Kubernetes release kubeproxy follows, and how `--version` and `kubernetes_build_info` say it.

Scripts and operators read `kube-proxy --version` as upstream prints it (`Kubernetes v1.37.2`), so
that line comes first, unchanged, with kubeproxy's own version after it.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass

from kubeproxy import __version__

# The release whose behaviour (flags, defaults, feature gates, rules) kubeproxy follows.
KUBERNETES_VERSION = "v1.37.2"

_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_FALSE = {"0", "f", "F", "FALSE", "false", "False"}
# Semantic version with an optional pre-release and build part, as k8s.io/apimachinery's
# version.ParseSemantic reads it (a leading "v" allowed).
_SEMVER = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")


@dataclass(frozen=True)
class VersionInfo:
    """The fields of upstream's version.Info (k8s.io/apimachinery/pkg/version), in its order."""

    git_version: str = KUBERNETES_VERSION

    @property
    def major(self) -> str:
        return self.git_version.lstrip("v").split(".")[0]

    @property
    def minor(self) -> str:
        return self.git_version.lstrip("v").split(".")[1]

    @property
    def platform(self) -> str:
        machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        return f"{platform.system().lower()}/{machine}"

    def fields(self) -> dict[str, str]:
        """Upstream's fields by name; those that describe a Go build are empty for kubeproxy."""
        return {
            "Major": self.major,
            "Minor": self.minor,
            "EmulationMajor": "",
            "EmulationMinor": "",
            "MinCompatibilityMajor": "",
            "MinCompatibilityMinor": "",
            "GitVersion": self.git_version,
            "GitCommit": "",
            "GitTreeState": "",
            "BuildDate": "",
            "GoVersion": "",
            "Compiler": "",
            "Platform": self.platform,
        }

    def line(self) -> str:
        """`--version`: upstream's line, then kubeproxy's own version."""
        return f"Kubernetes {self.git_version} (kubeproxy {__version__})"

    def raw(self) -> str:
        """`--version=raw`: Go's %#v of version.Info, as upstream prints it."""
        parts = ", ".join(f'{name}:"{value}"' for name, value in self.fields().items())
        return f"version.Info{{{parts}}}"


def parse_version_flag(text: str) -> str:
    """The value of `--version=X`: "true", "false", "raw", or a version to report instead of the
    default (same major, minor and patch, as upstream's verflag demands); ValueError with
    upstream's message otherwise."""
    if text == "raw":
        return text
    if text in _TRUE:
        return "true"
    if text in _FALSE:
        return "false"
    if text.startswith("v"):
        wanted, default = _SEMVER.fullmatch(text), _SEMVER.fullmatch(KUBERNETES_VERSION)
        assert default is not None
        if wanted is None:
            raise ValueError(f'could not parse "{text}" as version')
        if wanted.groups()[:3] != default.groups()[:3]:
            raise ValueError(f'version "{text}" must match major/minor/patch of default version "{KUBERNETES_VERSION}"')
        return text
    raise ValueError(f'strconv.ParseBool: parsing "{text}": invalid syntax')

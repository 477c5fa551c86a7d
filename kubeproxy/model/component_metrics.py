"""The metrics every upstream component exposes beside its own (k8s.io/component-base):
`kubernetes_build_info` and `kubernetes_feature_enabled`, with upstream's names, help and labels.

Both are constant for the life of the process, so they are collected from data at scrape time:
the version from kubeproxy/runtime/version.py, the gates from the pinned release's registry
(model/features.py) under this proxy's `featureGates`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeproxy.model.features import registry
from kubeproxy.runtime.version import VersionInfo

BUILD_INFO_HELP = (
    "[BETA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, "
    "build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running."
)
FEATURE_ENABLED_HELP = "[BETA] This metric records the data about the stage and enablement of a k8s feature."
# version.Info's field behind each label.
_BUILD_LABELS = {
    "build_date": "BuildDate",
    "compiler": "Compiler",
    "git_commit": "GitCommit",
    "git_tree_state": "GitTreeState",
    "git_version": "GitVersion",
    "go_version": "GoVersion",
    "major": "Major",
    "minor": "Minor",
    "platform": "Platform",
}


class BuildInfo(Collector):
    def __init__(self, version: VersionInfo | None = None) -> None:
        self._version = version or VersionInfo()

    def describe(self) -> Iterable[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        fields = self._version.fields()
        family = GaugeMetricFamily("kubernetes_build_info", BUILD_INFO_HELP, labels=list(_BUILD_LABELS))
        family.add_metric([fields[name] for name in _BUILD_LABELS.values()], 1)
        yield family


class FeatureEnabled(Collector):
    """One sample per gate of the release: 1 when enabled under `gates`. Upstream labels a GA
    gate's stage as the empty string."""

    def __init__(self, gates: Mapping[str, bool] | None = None) -> None:
        self._gates = dict(gates or {})

    def describe(self) -> Iterable[Metric]:
        return self.collect()

    def collect(self) -> Iterator[Metric]:
        release = registry()
        family = GaugeMetricFamily("kubernetes_feature_enabled", FEATURE_ENABLED_HELP, labels=["name", "stage"])
        for name in sorted(release.gates):
            stage = release.gates[name].stage
            family.add_metric([name, "" if stage == "GA" else stage], 1 if release.enabled(self._gates, name) else 0)
        yield family

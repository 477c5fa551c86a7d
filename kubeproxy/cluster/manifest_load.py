"""Cluster objects from manifest files and folders into one state, for `kubeproxy render`, the
demo, doctor, explain and the tests: a broken file is reported and skipped, not fatal."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kubeproxy.cluster.bulk import paused_gc
from kubeproxy.cluster.errors import ManifestError
from kubeproxy.cluster.manifests import manifest_files, parse_objects, read_text
from kubeproxy.cluster.state import ClusterState
from kubeproxy.cluster.validation import ParseOptions


@dataclass
class Loaded:
    state: ClusterState
    warnings: list[str] = field(default_factory=list)
    objects: int = 0


def load(paths: Iterable[str | Path], options: ParseOptions | None = None) -> Loaded:
    """Objects from files and folders, checked with `options`. A broken file is reported and skipped, not fatal."""
    warnings: list[str] = []
    object_warnings: list[str] = []
    try:
        files = manifest_files(paths)
    except ManifestError as exc:
        return Loaded(ClusterState(), [f"error: {exc}"])
    state = ClusterState(options=options or ParseOptions())
    count = 0
    # Each object goes into the state as it is read, and its raw dicts die then (by reference
    # count): the raw dicts of a whole file and the typed objects are never all alive at once.
    # The cyclic collector is paused meanwhile: it would walk the state's objects again and again.
    with paused_gc(freeze=True):  # the state outlives the block: see cluster.bulk
        for path in files:
            try:
                for obj in parse_objects(read_text(path), str(path)):
                    count += 1
                    if warning := state.apply(obj):
                        object_warnings.append(warning)
            except ManifestError as exc:
                warnings.append(f"error: {exc}")
    return Loaded(state, warnings + object_warnings, count)

"""Errors for Kubernetes objects and manifest files, worded for the person who wrote them."""

from __future__ import annotations


class ObjectError(ValueError):
    """An object that cannot be used: names the object and the offending field."""

    def __init__(self, kind: str, ref: str, field: str, problem: str) -> None:
        self.kind = kind
        self.ref = ref
        self.field = field
        self.problem = problem
        super().__init__(f"{kind} {ref}: {field}: {problem}")


class ManifestError(ValueError):
    """A file that is not YAML/JSON (or not Kubernetes objects at all): names the file and line."""

    def __init__(self, path: str, line: int | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {problem}")

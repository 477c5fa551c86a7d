"""YAML as upstream's components write it (sigs.k8s.io/yaml over go-yaml): keys sorted, block
style, two-space indent, lists at their key's indent, and a string that would not read back as
itself in double quotes (go-yaml's choice; PyYAML's own is single quotes)."""

from __future__ import annotations

from typing import Any

import yaml


class _GoEmitter(yaml.emitter.Emitter):
    def choose_scalar_style(self) -> str:
        style: str = super().choose_scalar_style()
        return '"' if style == "'" else style


class _GoDumper(_GoEmitter, yaml.serializer.Serializer, yaml.representer.SafeRepresenter, yaml.resolver.Resolver):
    def __init__(self, stream: Any, **kwargs: Any) -> None:
        _GoEmitter.__init__(self, stream, **{k: kwargs[k] for k in ("indent", "width", "allow_unicode") if k in kwargs})
        yaml.serializer.Serializer.__init__(self)
        yaml.representer.SafeRepresenter.__init__(self, default_flow_style=False, sort_keys=True)
        yaml.resolver.Resolver.__init__(self)


def dump(doc: Any) -> str:
    """`doc` (plain dicts, lists, strings, numbers, booleans, None) as go-yaml would write it."""
    text: str = yaml.dump(doc, Dumper=_GoDumper, allow_unicode=True, width=1 << 30)
    return text

"""`--proxy-mode` as a click option of kubeproxy's commands (`render`, `run`, `explain`, ...)."""

from __future__ import annotations

import click

from kubeproxy.proxy.config import PROXY_MODES


class ModeChoice(click.Choice[str]):
    """--proxy-mode's choices: the modes registered when the flag is read (backends/registry.py)."""

    def __init__(self) -> None:
        super().__init__(PROXY_MODES)

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(PROXY_MODES)

    @choices.setter
    def choices(self, value: object) -> None:
        pass  # the registry's, read at each use

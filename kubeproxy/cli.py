"""The command line: parses flags (upstream names where upstream has them) and calls the layers."""

from __future__ import annotations

import click

from kubeproxy import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="kubeproxy")
def main() -> None:
    """A Kubernetes service proxy (drop-in kube-proxy), and tools that explain what it does to packets."""

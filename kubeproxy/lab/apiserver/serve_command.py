"""`python -m kubeproxy.lab.apiserver`: serve an empty cluster on 127.0.0.1 for demos and for the
lab's node namespace."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import click

from kubeproxy.lab.apiserver.lifecycle import ApiServer
from kubeproxy.lab.apiserver.resources import DEFAULT_RESOURCES, DEPLOY_RESOURCES

log = logging.getLogger("kubeproxy.lab.apiserver")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--port", type=int, default=0, show_default=True, help="Port on 127.0.0.1 (0: any free one).")
@click.option(
    "--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), help="Write a kubeconfig pointing at the server here."
)
@click.option("--bookmark-interval", type=float, default=30.0, show_default=True, help="Seconds between BOOKMARKs.")
@click.option("--deploy-kinds", is_flag=True, help="Also serve what deploy/ holds (DaemonSet, ConfigMap, RBAC, ...).")
def main(port: int, kubeconfig: Path | None, bookmark_interval: float, deploy_kinds: bool) -> None:
    """Serve an empty cluster on 127.0.0.1 for demos: `python -m kubeproxy.lab.apiserver`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    resources = DEPLOY_RESOURCES if deploy_kinds else DEFAULT_RESOURCES
    server = ApiServer(bookmark_interval=bookmark_interval, port=port, resources=resources)
    try:
        server.start()
    except OSError as e:
        raise click.ClickException(f"cannot listen on 127.0.0.1:{port}: {e.strerror}") from None
    if kubeconfig is not None:
        log.info("kubeconfig written to %s", server.write_kubeconfig(kubeconfig))
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()

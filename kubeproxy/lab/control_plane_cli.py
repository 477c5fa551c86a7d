"""`kubeproxy lab control-plane`: upstream's etcd, kube-apiserver and kube-controller-manager on
loopback in this network namespace until stopped (Ctrl-C or SIGTERM), with an admin kubeconfig."""

from __future__ import annotations

import shutil
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType

import click

from kubeproxy.lab.control_plane import (
    SERVICE_CIDR,
    UPSTREAM_BIN_ENV,
    ControlPlane,
    ControlPlaneError,
    copy_admin_kubeconfig,
    upstream_bin,
)

_POLL_SECONDS = 1.0  # how often a part that died is noticed while serving


@click.command("control-plane")
@click.option(
    "--kubeconfig",
    "kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write the admin kubeconfig.",
)
@click.option(
    "--bin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help=f"Upstream's binaries (default: ${UPSTREAM_BIN_ENV}, else scripts/upstream's cache).",
)
@click.option("--address", default="127.0.0.1", show_default=True, help="The API server's bind address.")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="The API server's port (default: a free one).")
@click.option("--service-cluster-ip-range", "service_cidr", default=SERVICE_CIDR, show_default=True)
def control_plane(kubeconfig: Path, bin_dir: Path | None, address: str, port: int | None, service_cidr: str) -> None:
    """Run upstream's control plane (built by scripts/upstream) until stopped."""
    folder = bin_dir or upstream_bin()
    if folder is None:
        raise click.ClickException(f"upstream's binaries are not built: run scripts/upstream (or set ${UPSTREAM_BIN_ENV})")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workdir = Path(tempfile.mkdtemp(prefix="kp-control-plane-"))
    try:
        with ControlPlane.start(folder, workdir, address=address, port=port, service_cidr=service_cidr) as cp:
            copy_admin_kubeconfig(cp, kubeconfig)
            click.echo(f"control plane ready in {cp.startup_seconds:.1f} s at {cp.server}; "
                       f"admin kubeconfig {kubeconfig}; logs in {workdir}")  # fmt: skip
            while not stop.wait(_POLL_SECONDS):
                cp.check_alive()
    except ControlPlaneError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

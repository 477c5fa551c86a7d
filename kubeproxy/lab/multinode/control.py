"""The lab's control plane: the test API server (kubeproxy.lab.apiserver) in this process, with
its listening socket in the control-plane namespace, so every node's proxy reaches it over the
underlay while the test changes objects directly (`api.apply(...)`, no kubectl round trip).

A socket belongs to the network namespace of the thread that created it, and threads inherit
their creator's namespace: so one short-lived thread enters the namespace (setns, which for a
network namespace affects the calling thread only) and starts the server there; the server's own
threads are born inside. The rest of the process stays where it was.
"""

from __future__ import annotations

import ctypes
import os
import threading

from kubeproxy.lab import netns as L
from kubeproxy.lab.apiserver import ApiServer

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/var/run/netns"


def start_in(ns: L.NetNS, server: ApiServer) -> str:
    """`server.start()` with its socket in `ns`; returns its URL."""
    outcome: list[str | BaseException] = []

    def enter_and_start() -> None:
        try:
            fd = os.open(os.path.join(NETNS_DIR, ns.name), os.O_RDONLY)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into {ns.name}: {os.strerror(err)}")
            finally:
                os.close(fd)
            outcome.append(server.start())
        except BaseException as exc:  # handed to the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=enter_and_start, name=f"apiserver in {ns.name}")
    thread.start()
    thread.join()
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    return result

"""Entry point of a load worker process (`python -m kubeproxy.lab.dns.worker`), driven by `load.run_load`."""

from __future__ import annotations

import sys

from kubeproxy.lab.dns.load import worker_stdio

if __name__ == "__main__":
    worker_stdio(sys.stdin.buffer, sys.stdout.buffer)

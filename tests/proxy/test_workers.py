"""Worker threads never keep a SIGTERMed proxy alive: a call stuck in a read is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kubeproxy.proxy.workers import DaemonExecutor

pytestmark = pytest.mark.timeout(60)

# A proxy whose source is stuck the way a blocking open of a FIFO without a writer sticks it,
# in a worker thread of the event loop, served by the proxy's own signal handling.
_STUCK_PROXY = """
import asyncio, logging, sys
from kubeproxy.proxy import live_loop

logging.basicConfig(level=logging.INFO, stream=sys.stderr)

def stuck_read(fifo):
    print("stuck", flush=True)
    with open(fifo) as f:
        return f.read()

class StuckSource:
    manage_gc = False

    async def serve(self, source):
        await asyncio.to_thread(stuck_read, sys.argv[1])

asyncio.run(live_loop.run_until_signalled(StuckSource(), None, join_timeout=float(sys.argv[2])))
"""


def test_sigterm_ends_the_proxy_while_a_source_thread_is_stuck(tmp_path: Path) -> None:
    fifo = tmp_path / "manifest.yaml"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-c", _STUCK_PROXY, str(fifo), "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "stuck\n"  # the worker is in open() (or about to be)
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.stderr is not None
    assert status == 0, proc.stderr.read()
    assert "Exiting, leaving the rules in place" in proc.stderr.read()


def test_shutdown_waits_for_calls_that_finish() -> None:
    executor = DaemonExecutor(join_timeout=30.0)
    release = threading.Event()
    future = executor.submit(lambda: release.wait(30) and "done")
    release.set()
    executor.shutdown(wait=True)
    assert future.result(timeout=0) == "done"
    assert executor.running == 0


def test_shutdown_gives_up_on_a_stuck_call_after_its_timeout() -> None:
    executor = DaemonExecutor(join_timeout=0.05)
    stuck = threading.Event()
    future = executor.submit(stuck.wait)
    started = time.monotonic()
    executor.shutdown(wait=True)
    assert time.monotonic() - started < 20  # bounded, where the default executor waits for ever
    assert not future.done() and executor.running == 1
    assert all(t.daemon for t in threading.enumerate() if t.name == "kubeproxy-worker")
    stuck.set()
    future.result(timeout=10)


def test_exceptions_reach_the_caller_and_no_call_is_taken_after_shutdown() -> None:
    executor = DaemonExecutor()
    future = executor.submit(int, "x")
    with pytest.raises(ValueError):
        future.result(timeout=10)
    executor.shutdown()
    with pytest.raises(RuntimeError):
        executor.submit(int, "1")

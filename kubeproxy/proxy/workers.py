"""The proxy's worker threads: they never keep the process alive past its grace period.

asyncio's default executor joins every worker at exit, for ever: one call stuck in a read (a
FIFO, a hung network filesystem) or in a kernel tool would keep a SIGTERMed proxy running until
SIGKILL. `DaemonExecutor` runs each call in a daemon thread, and its shutdown waits for the
calls in flight (a sync may be feeding `nft` or `iptables-restore`) at most `join_timeout`
seconds in all; whatever is still running then ends with the process.

    loop.set_default_executor(DaemonExecutor(join_timeout=10.0))
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Within Kubernetes' default 30 s termination grace, with room for the rest of the shutdown.
DEFAULT_JOIN_TIMEOUT = 10.0


class DaemonExecutor(ThreadPoolExecutor):
    """Each call in its own daemon thread; `shutdown(wait=True)` waits `join_timeout` seconds at most.

    A ThreadPoolExecutor only by type, which asyncio requires of a default executor: no call goes to
    the pool's own (non-daemon, joined at exit) threads."""

    def __init__(self, join_timeout: float = DEFAULT_JOIN_TIMEOUT, name: str = "kubeproxy-worker") -> None:
        super().__init__(max_workers=1, thread_name_prefix=name)
        self.join_timeout = join_timeout
        self.name = name
        self._lock = threading.Lock()
        self._running: set[threading.Thread] = set()
        self._shut = False

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future: Future[T] = Future()

        def work() -> None:
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        result = fn(*args, **kwargs)
                    except BaseException as exc:
                        future.set_exception(exc)
                    else:
                        future.set_result(result)
            finally:
                with self._lock:
                    self._running.discard(threading.current_thread())

        thread = threading.Thread(target=work, name=self.name, daemon=True)
        with self._lock:
            if self._shut:
                raise RuntimeError("cannot schedule new calls after shutdown")
            self._running.add(thread)
        thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shut = True
            threads = list(self._running)
        if not wait:
            return
        deadline = time.monotonic() + self.join_timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    @property
    def running(self) -> int:
        """Calls still in flight."""
        with self._lock:
            return len(self._running)

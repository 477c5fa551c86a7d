"""nft transactions in-process through libnftables (ctypes), instead of one `nft -f -` process each.

Starting the `nft` process (exec, dynamic linking, its own init) is ~25 ms of a one-change sync
in nftables mode; libnftables, the library `nft` itself is a thin shell around (Debian's
libnftables1, a dependency of the nftables package), takes the same text in-process.

`LibNft.open()` returns None where the library cannot be loaded: callers then keep running the
`nft` process. `LibNft.open(netns_path=...)` binds the context to another network namespace: the
netlink socket libnftables opens in `nft_ctx_new` belongs to the namespace of the thread that
creates it, so a short-lived thread enters the namespace, creates the context and exits; the
socket stays in that namespace whatever thread later uses it. If that fails, open raises rather
than quietly returning a context that would program this host's own ruleset.

Memory: libnftables parses a transaction into its own structures, in our heap. A cold sync at
10k services x 10 endpoints (120k elements, 9 MiB of text) took RSS from 148 to 271 MiB, and
glibc kept those pages after libnftables freed them: the proxy held the peak of its biggest
transaction for good. After a transaction of `TRIM_AFTER_BYTES` or more, `malloc_trim(0)` hands
the free pages back (271 -> 148 MiB, a few ms); small syncs do not pay for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from kubeproxy.kernel.exec import Runner
from kubeproxy.kernel.host import Capability, host_of
from kubeproxy.runtime.memory import find_malloc_trim

log = logging.getLogger("kubeproxy.nftables")

_CLONE_NEWNET = 0x40000000
_NFT_CTX_DEFAULT = 0
_LIBRARY = "libnftables.so.1"
TRIM_AFTER_BYTES = 1 << 20  # transactions this large give their memory back (see above)


class LibNftError(OSError):
    """libnftables could not be set up for the namespace asked for."""


def _load() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL(_LIBRARY)
    except OSError:
        return None
    lib.nft_ctx_new.restype = ctypes.c_void_p
    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
    lib.nft_ctx_set_dry_run.argtypes = [ctypes.c_void_p, ctypes.c_bool]
    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
    return lib


def _new_context(lib: ctypes.CDLL, netns_path: str | None) -> int:
    if netns_path is None:
        ctx = lib.nft_ctx_new(_NFT_CTX_DEFAULT)
        if not ctx:
            raise LibNftError("nft_ctx_new failed")
        return int(ctx)
    result: list[int] = []
    errors: list[str] = []

    def create() -> None:
        # setns changes only this thread's namespace; the thread ends right after, so no other
        # code ever runs in the namespace by accident.
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        try:
            fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            errors.append(f"open {netns_path}: {exc}")
            return
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                errors.append(f"setns {netns_path}: {os.strerror(ctypes.get_errno())}")
                return
        finally:
            os.close(fd)
        ctx = lib.nft_ctx_new(_NFT_CTX_DEFAULT)
        if ctx:
            result.append(int(ctx))
        else:
            errors.append("nft_ctx_new failed")

    thread = threading.Thread(target=create, name="libnft-setns")
    thread.start()
    thread.join()
    if errors or not result:
        raise LibNftError("; ".join(errors) or "nft_ctx_new failed")
    return result[0]


@dataclass
class LibNft:
    """One libnftables context; `run_text` is `nft -f -` (or `nft -c -f -` with check=True)."""

    _lib: ctypes.CDLL
    _ctx: int
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _trim: Callable[[int], int] | None = field(default_factory=find_malloc_trim)
    trims: int = 0  # transactions after which memory was handed back (tests, metrics)

    @classmethod
    def open(cls, netns_path: str | None = None) -> LibNft | None:
        """A context in this process's namespace or in `netns_path`; None without the library."""
        lib = _load()
        if lib is None:
            return None
        ctx = _new_context(lib, netns_path)
        lib.nft_ctx_buffer_output(ctx)
        lib.nft_ctx_buffer_error(ctx)
        return cls(lib, ctx)

    def run_text(self, text: str, *, check: bool = False) -> tuple[int, str, str]:
        """(return code, output, error text) of running `text` as an nft script."""
        data = text.encode()
        # One context is not safe to use from two threads at once; the buffers are per context.
        with self._lock:
            self._lib.nft_ctx_set_dry_run(self._ctx, check)
            try:
                rc = self._lib.nft_run_cmd_from_buffer(self._ctx, data)
            finally:
                self._lib.nft_ctx_set_dry_run(self._ctx, False)
            out = (self._lib.nft_ctx_get_output_buffer(self._ctx) or b"").decode(errors="replace")
            err = (self._lib.nft_ctx_get_error_buffer(self._ctx) or b"").decode(errors="replace")
            if len(data) >= TRIM_AFTER_BYTES and self._trim is not None:
                del data
                self._trim(0)
                self.trims += 1
        return (0 if rc == 0 else 1), out, err

    def close(self) -> None:
        with self._lock:
            if self._ctx:
                self._lib.nft_ctx_free(self._ctx)
                self._ctx = 0


def for_runner(run: Runner) -> LibNft | None:
    """An in-process context where `run` runs its tools, or None to keep running `nft`.

    A host that declares it may be entered (host.Capability.ENTER: this host, the lab's and
    the benches' namespaces) gets one in its namespace; any other runner (the fakes in tests, a
    plain function) does not, so its `nft` calls keep going through it.
    """
    host = host_of(run)
    if Capability.ENTER not in host.capabilities:
        return None
    path = host.netns_path
    try:
        return LibNft.open(path)
    except LibNftError as exc:
        log.info("libnftables unavailable here (%s): running the nft process", exc)
        return None

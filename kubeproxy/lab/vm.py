"""A throwaway VM with Debian's own kernel, for what the host's kernel lacks (IPVS).

The machines this project runs on have a kernel built without IPVS and no usable KVM, so the
IPVS kernel tests boot Debian's stock kernel (the one `linux-image-amd64` names) under qemu's
TCG over the host's own file system: the root is the host's `/` shared read-only over 9p with a
tmpfs overlay on top, so every tool installed on the host (iptables, ipset, ipvsadm, the repo's
.venv) is there in the guest unchanged. See docs in ../shared/notes/ipvs-vm.md for the figures.

One boot runs one batch: `VM.run(script)` writes the script into a directory shared read-write
over 9p, the guest runs it with its output and exit status written back there, then powers off.
Python is ~40x slower under TCG, so callers keep the guest's work small and batch it.

The kernel package, its modules and the initramfs are built once into a cache directory
(`.cache/vm/` at the repo root unless KUBEPROXY_VM_CACHE says otherwise) and reused.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# The order matters: each module needs the ones before it (virtio transport, then 9p, then overlay).
INITRAMFS_MODULES: tuple[str, ...] = (
    "virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
    "9pnet", "9pnet_virtio", "netfs", "fscache", "9p", "overlay",
)
# Host tools the harness needs, and the Debian package that provides each.
HOST_TOOLS: dict[str, str] = {
    "qemu-system-x86_64": "qemu-system-x86", "cpio": "cpio", "depmod": "kmod", "dpkg": "dpkg",
}
BUSYBOX = "/bin/busybox"  # busybox-static: the initramfs has no libc to link against

# The initramfs's /init: mount the host's root read-only under a tmpfs overlay, the kernel's
# modules and the results directory beside it, then hand over to the batch runner. Every failure
# powers the machine off so that the host never waits for its timeout on a guest that is stuck.
_INIT = r"""#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
die() { echo "vm-init: $*"; echo o > /proc/sysrq-trigger; sleep 60; }
for m in $(cat /modules.order); do insmod /mods/$m.ko || die "insmod $m"; done
mkdir -p /lower /rw /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /lower || die "mount hostroot"
mount -t tmpfs -o size=512m tmpfs /rw || die "tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot || die overlay
mkdir -p /newroot/lib/modules /newroot/vmresults
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 mods /newroot/lib/modules || die "mount mods"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=none results /newroot/vmresults || die "mount results"
for d in proc sys dev; do mount --move /$d /newroot/$d; done
# /tmp stays the host's (writable through the overlay): a checkout under /tmp (CI clones anywhere) must be seen.
mount -t tmpfs tmpfs /newroot/run
exec switch_root /newroot /bin/sh -c '
cd /vmresults
echo start > /vmresults/started
/bin/sh /vmresults/run.sh > /vmresults/output 2>&1
echo $? > /vmresults/rc
sync
echo o > /proc/sysrq-trigger
sleep 60'
"""


class VMError(RuntimeError):
    """The VM could not be built or booted, or the guest did not report a result."""


@dataclass(frozen=True)
class VMResult:
    returncode: int
    output: str
    boot_seconds: float  # from qemu's start to the guest starting the batch
    total_seconds: float  # from qemu's start to its exit
    files: dict[str, str]  # other files the batch left in its working directory (/vmresults)


def default_cache() -> Path:
    env = os.environ.get("KUBEPROXY_VM_CACHE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".cache" / "vm"


def missing_tools() -> list[str]:
    """Debian packages to install before the VM can be built (empty when all is there)."""
    need = [pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None]
    if not os.access(BUSYBOX, os.X_OK):
        need.append("busybox-static")
    return need


def _run(argv: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VMError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def kernel_package() -> str:
    """The versioned kernel package Debian's `linux-image-amd64` depends on (e.g. linux-image-6.1.0-56-amd64)."""
    for line in _run(["apt-cache", "depends", "linux-image-amd64"]).splitlines():
        line = line.strip()
        if line.startswith("Depends:") and "linux-image-" in line:
            return line.split()[-1]
    raise VMError("apt-cache depends linux-image-amd64 names no linux-image package (run apt-get update)")


@dataclass(frozen=True)
class VMImage:
    kernel: Path  # vmlinuz
    initramfs: Path
    modules: Path  # FOLDER/lib/modules, exported to the guest
    version: str  # e.g. 6.1.0-56-amd64


def build(cache: Path | None = None) -> VMImage:
    """Fetch and unpack the kernel and build the initramfs, once; later calls reuse the cache."""
    cache = cache or default_cache()
    need = missing_tools()
    if need:
        raise VMError(f"the VM needs the packages {' '.join(need)} (scripts/setup installs them)")
    pkg = kernel_package()
    version = pkg.removeprefix("linux-image-")
    root = cache / version
    # The initramfs holds _INIT: its name carries the script's hash, so a changed script is rebuilt.
    init_id = hashlib.sha256(_INIT.encode()).hexdigest()[:12]
    image = VMImage(root / "kernel" / "boot" / f"vmlinuz-{version}", root / f"initramfs-{init_id}.cpio.gz",
                    root / "kernel" / "lib" / "modules", version)
    if image.initramfs.exists() and image.kernel.exists():
        return image
    root.mkdir(parents=True, exist_ok=True)
    if image.kernel.exists():
        with tempfile.TemporaryDirectory(dir=root) as scratch_s:
            _build_initramfs(image.modules / version, Path(scratch_s) / "initramfs.cpio.gz")
            (Path(scratch_s) / "initramfs.cpio.gz").rename(image.initramfs)
        return image
    # Build in a scratch directory beside the final one and rename it into place: an interrupted
    # build then leaves no half-made cache that later runs would trust.
    with tempfile.TemporaryDirectory(dir=root) as scratch_s:
        scratch = Path(scratch_s)
        _run(["apt-get", "download", pkg], cwd=scratch)
        debs = sorted(scratch.glob(f"{pkg}_*.deb"))
        if not debs:
            raise VMError(f"apt-get download {pkg} left no .deb")
        kdir = scratch / "kernel"
        _run(["dpkg", "-x", str(debs[0]), str(kdir)])
        # Debian ships modules.dep in the package's postinst, not in the archive: make it here.
        _run(["depmod", "-b", str(kdir), version])
        _build_initramfs(kdir / "lib" / "modules" / version, scratch / "initramfs.cpio.gz")
        if (root / "kernel").exists():
            shutil.rmtree(root / "kernel")
        kdir.rename(root / "kernel")
        (scratch / "initramfs.cpio.gz").rename(image.initramfs)
    return image


def _find_module(moddir: Path, name: str) -> Path:
    for pattern in (f"{name}.ko", f"{name}.ko.xz", f"{name}.ko.zst"):
        hits = sorted(moddir.rglob(pattern))
        if hits:
            return hits[0]
    raise VMError(f"module {name} is not in {moddir}")


def _build_initramfs(moddir: Path, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tree_s:
        tree = Path(tree_s)
        for d in ("bin", "proc", "sys", "dev", "mods"):
            (tree / d).mkdir()
        shutil.copy(BUSYBOX, tree / "bin" / "busybox")
        for name in INITRAMFS_MODULES:
            src = _find_module(moddir, name)
            if src.suffix != ".ko":
                raise VMError(f"{src}: compressed modules are not handled; busybox insmod needs plain .ko")
            shutil.copy(src, tree / "mods" / f"{name}.ko")
        (tree / "modules.order").write_text("\n".join(INITRAMFS_MODULES) + "\n")
        init = tree / "init"
        init.write_text(_INIT)
        init.chmod(0o755)
        files = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
        proc = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=tree,
                              input=("\n".join(files) + "\n").encode(), capture_output=True, check=False)
        if proc.returncode != 0:
            raise VMError(f"cpio: {proc.stderr.decode(errors='replace').strip()}")
        out.write_bytes(gzip.compress(proc.stdout, compresslevel=6))


class VM:
    """Boots the cached image; each `run` is one boot."""

    def __init__(self, image: VMImage, *, memory_mb: int = 2048, cpus: int = 2) -> None:
        self.image = image
        self.memory_mb = memory_mb
        self.cpus = cpus

    def argv(self, results: Path) -> list[str]:
        # TCG, not KVM: /dev/kvm exists on these machines but qemu aborts or hangs with it (see the note).
        return [
            "qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-m", str(self.memory_mb),
            "-smp", str(self.cpus), "-nographic", "-no-reboot", "-nodefaults", "-serial", "stdio",
            "-kernel", str(self.image.kernel), "-initrd", str(self.image.initramfs),
            "-append", "console=ttyS0 quiet panic=-1",
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={self.image.modules},mount_tag=mods,security_model=none,readonly=on",
            "-virtfs", f"local,path={results},mount_tag=results,security_model=none",
        ]

    def run(self, script: str, *, timeout: float = 600.0, files: dict[str, str] | None = None) -> VMResult:
        """Boot, run `script` with /bin/sh in the guest (cwd /vmresults, where `files` are put), power off."""
        with tempfile.TemporaryDirectory(prefix="kubeproxy-vm-") as results_s:
            results = Path(results_s)
            (results / "run.sh").write_text(script)
            for name, text in (files or {}).items():
                (results / name).write_text(text)
            started = time.monotonic()
            wall_start = time.time()  # compared with the mtime of the guest's "started" file (same clock: 9p)
            proc = subprocess.Popen(self.argv(results), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
            try:
                console, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                console, _ = proc.communicate()
                raise VMError(f"the VM did not power off within {timeout} s; console:\n"
                              f"{console.decode(errors='replace')[-3000:]}") from None
            finally:
                # Interrupted otherwise (Ctrl-C, pytest-timeout): no guest may outlive its batch.
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            total = time.monotonic() - started
            started_file = results / "started"
            rc_file = results / "rc"
            if not rc_file.exists():
                raise VMError(f"the guest reported no exit status (qemu exited {proc.returncode}); console:\n"
                              f"{console.decode(errors='replace')[-3000:]}")
            boot = started_file.stat().st_mtime - wall_start if started_file.exists() else 0.0
            out = {p.name: p.read_text(errors="replace") for p in results.iterdir()
                   if p.is_file() and p.name not in {"run.sh", "rc", "output", "started"} and p.name not in (files or {})}
            return VMResult(int(rc_file.read_text().strip() or "255"), (results / "output").read_text(errors="replace"),
                            boot, total, out)

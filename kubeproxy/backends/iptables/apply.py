"""The only code that hands iptables rules to the kernel: iptables-restore fed on stdin.

Every function takes a `run` callable (kernel/exec.py) so that the same code drives the host, a
test namespace (`NetNS.run`) or the fake (`FakeIptables.run`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from kubeproxy.kernel.exec import Runner, bounded, local_run
from kubeproxy.kernel.host import host_of
from kubeproxy.model.contract import SyncError
from kubeproxy.model.options import Family


class RestoreError(SyncError):
    """iptables-restore refused the input; the message carries its complaint."""


# A restore's time grows with its input (iptables-legacy-restore loads 10k services' 300k lines
# in ~12 s, iptables-nft-restore takes far longer), and a loaded node is slower still: a fixed
# bound that suits a small cluster kills a cold sync at 20k. The base covers the fixed costs
# (the xtables lock, fetching the table), the allowance each line. A restore that still runs
# out of time raises ToolTimeout, and the live loop's next attempt gets twice the bound
# (kernel/exec.py's Patience); upstream bounds no restore at all.
RESTORE_TIMEOUT_BASE = 60.0
RESTORE_TIMEOUT_PER_LINE = 0.001


def input_lines(text: str | Sequence[str]) -> int:
    return text.count("\n") if isinstance(text, str) else sum(chunk.count("\n") for chunk in text)


def restore_timeout(text: str | Sequence[str], lines: int | None = None) -> float:
    """The bound of one restore of `text` (or its pieces; `lines` if counted): 60 s plus 1 ms a
    line (5 min for 240k lines)."""
    return RESTORE_TIMEOUT_BASE + RESTORE_TIMEOUT_PER_LINE * (input_lines(text) if lines is None else lines)


def iptables_tool(family: Family, variant: str = "", suffix: str = "") -> str:
    """The family's tool: `iptables`, `ip6tables-legacy-restore`, ... `variant` "legacy" or "nft"
    picks one explicitly; "" is the system's."""
    return ("ip6tables" if family.ipv6 else "iptables") + (f"-{variant}" if variant else "") + suffix


def restore(
    text: str | Sequence[str],
    run: Runner = local_run,
    *,
    family: Family = Family.IPV4,
    variant: str = "",
    timeout: float | None = None,
) -> None:
    """Load a full or partial sync: --noflush leaves chains that are not ours alone.

    `text` one string or its pieces in order (written as they come where the host can: `run_chunks`).
    `variant` picks "legacy" or "nft" explicitly; by default the system's iptables-restore.
    `timeout` None: `restore_timeout(text)`. Running out of it raises ToolTimeout.
    """
    binary = iptables_tool(family, variant, "-restore")
    lines = input_lines(text)
    bound = restore_timeout(text, lines) if timeout is None else timeout
    argv = [binary, "-w", "--noflush", "--counters"]
    with bounded(binary, lines):
        if isinstance(text, str):
            proc = run(argv, input=text, check=False, timeout=bound)
        else:  # written piece by piece where the host can, else joined (host.Commands)
            proc = host_of(run).run_chunks(argv, text, check=False, timeout=bound)
    if proc.returncode != 0:
        raise RestoreError(f"{binary} failed: {proc.stderr.strip()}")


def check_restore(
    text: str, run: Runner = local_run, *, family: Family = Family.IPV4, variant: str = "", timeout: float | None = None
) -> str | None:
    """What iptables-restore says of `text` without committing it (`--test`); None if it takes it.
    Running out of time raises ToolTimeout: a slow tool says nothing of the rules."""
    binary = iptables_tool(family, variant, "-restore")
    lines = input_lines(text)
    bound = restore_timeout(text, lines) if timeout is None else timeout
    with bounded(binary, lines):
        proc = run([binary, "-w", "--noflush", "--test"], input=text, check=False, timeout=bound)
    return None if proc.returncode == 0 else f"{binary} failed: {proc.stderr.strip()}"


def ensure_nfacct_counters(names: Collection[str], run: Runner = local_run) -> set[str]:
    """Create the nfacct counters upstream uses; return those that exist afterwards.

    Like upstream, a kernel (or host) without nfacct support is not an error: the rules that
    would reference a missing counter are rendered without it.
    """
    present: set[str] = set()
    for name in names:
        try:
            listed = run(["nfacct", "get", name], check=False)
            if listed.returncode != 0:
                run(["nfacct", "add", name], check=False)
                listed = run(["nfacct", "get", name], check=False)
        except (FileNotFoundError, OSError):
            return present
        if listed.returncode == 0:
            present.add(name)
    return present


def nfacct_packets(name: str, run: Runner = local_run) -> int | None:
    """The packet count of one nfacct counter (`nfacct get NAME`), None if it cannot be read."""
    try:
        proc = run(["nfacct", "get", name], check=False)
    except (FileNotFoundError, OSError):
        return None
    # `{ pkts = 00000000000000000042, bytes = 00000000000000003360 } = NAME;`
    fields = proc.stdout.replace("{", " ").replace("}", " ").replace(",", " ").split()
    if proc.returncode != 0 or "pkts" not in fields:
        return None
    try:
        return int(fields[fields.index("pkts") + 2])
    except (IndexError, ValueError):
        return None

"""What a node's kernel rules say about each service port, in the proxy's mode.

The test beds wait on the kernel, not on the proxy's word: `read(mode, run, services)` takes one
snapshot of the node's rules with the reader the mode's record names (`Mode.readback`, a module
in the mode's folder; model/rules_readback.py says what it answers), given the keys of the
Services' ports for the modes whose rules do not name them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from kubeproxy.backends import registry
from kubeproxy.model.options import Family
from kubeproxy.model.rules_readback import JSON, Reader, Run, service_ports
from kubeproxy.model.rules_readback import NodeRules as NodeRules

# Every mode the lab can read back.
KNOWN_MODES = tuple(m.name for m in registry.MODES.values() if m.readback)
# The modes the host kernel's beds run (tests/e2e): none needing a kernel module the host may
# lack (ipvs: its beds run in the VM, tests/vm), none relaying connections itself (the
# scenarios check what reaches the pods: client addresses, a NAT's conntrack entries).
MODES = tuple(m.name for m in registry.MODES.values() if m.readback and not m.kernel_modules and not m.relays)


def reader(mode: str) -> Reader:
    """The mode's reader; ValueError for a mode the lab cannot read back."""
    module = registry.mode(mode).readback
    if not module:
        raise ValueError(f"proxy mode {mode!r}: the lab reads back only {', '.join(KNOWN_MODES)}")
    found: Reader = importlib.import_module(module).read_rules
    return found


def read(mode: str, run: Run, services: Iterable[JSON] = (), family: Family = Family.IPV4) -> NodeRules:
    """A snapshot of the `family` rules a proxy in `mode` programs, against the ports of `services`."""
    return reader(mode)(run, service_ports(services), family)

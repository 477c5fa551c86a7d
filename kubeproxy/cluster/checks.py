"""`CheckCache`: the outcome of a validation check for strings that repeat across objects.

20k objects repeat a handful of strings thousands of times: the namespace, the label key
`kubernetes.io/service-name`, five node names, the port name `http`. Each is checked once per
cluster state, not once per object, and every object gets the same (interned) string object, so
100k endpoints share five node-name strings. The cache belongs to one `ClusterState` (no global
state), remembers only values that passed (a failing value is checked again each time, so its
error is worded the usual way), and is bounded: when a check's table is full it starts over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from sys import intern

Check = Callable[[str], "str | None"]  # a validation check: the problem, or None

# Enough for every namespace, node name, label key and port name of a large cluster; a cluster
# with more distinct values only checks some of them again. 4096 short strings: ~0.5 MiB at most.
DEFAULT_LIMIT = 4096


@dataclass
class CheckCache:
    limit: int = DEFAULT_LIMIT
    _passed: dict[Check, dict[str, str]] = field(default_factory=dict, repr=False)

    def passed(self, check: Check) -> dict[str, str]:
        """The values known to pass `check`, each mapped to its shared copy: one `get` in a hot
        loop, then `canonical` for a value it does not hold."""
        passed = self._passed.get(check)
        if passed is None:
            passed = self._passed[check] = {}
        return passed

    def canonical(self, check: Check, value: str) -> str | None:
        """`value`'s shared (interned) copy if `check` finds no problem with it, else None."""
        passed = self.passed(check)
        known = passed.get(value)
        if known is not None:
            return known
        if check(value) is not None:
            return None
        if len(passed) >= self.limit:
            passed.clear()  # bounded: the values that repeat come back at once
        known = passed[value] = intern(value)
        return known

    def passes(self, check: Check, value: str) -> bool:
        """Whether `check(value)` finds no problem (a cached pass, or the check run now)."""
        return self.canonical(check, value) is not None

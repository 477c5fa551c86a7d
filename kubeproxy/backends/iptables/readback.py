"""An iptables-mode node's rules read back per service port (model/rules_readback.py):
`iptables-save`, whose rule comments name the service port as upstream's do."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from kubeproxy.backends.iptables.apply import iptables_tool
from kubeproxy.model.options import Family
from kubeproxy.model.rules_readback import NodeRules, Run, ServicePortKeys, names


def read_rules(run: Run, ports: Mapping[str, ServicePortKeys], family: Family = Family.IPV4) -> NodeRules:
    """The node's rules of `family`; the comments name every port, so the keys are not needed."""
    return IptablesRules(run, family)


@dataclass
class IptablesRules:
    """`iptables-save` (`ip6tables-save`) of the nat table (and of filter, read when first needed)."""

    run: Run
    family: Family = Family.IPV4

    def _save(self, table: str) -> str:
        return str(self.run([iptables_tool(self.family, suffix="-save"), "-t", table]).stdout)

    @cached_property
    def nat(self) -> str:
        return self._save("nat")

    @cached_property
    def filter(self) -> str:
        return self._save("filter")

    @property
    def text(self) -> str:
        return self.nat + self.filter

    def endpoints(self, service_port: str) -> set[str]:
        found = set()
        for line in self.nat.splitlines():
            if not (line.startswith("-A KUBE-SEP-") and "--to-destination" in line):
                continue
            words = shlex.split(line)
            if "--comment" in words and words[words.index("--comment") + 1] == service_port:
                found.add(words[words.index("--to-destination") + 1])
        return found

    def rejects(self, service_port: str) -> bool:
        return f'"{service_port} has no endpoints"' in self.filter

    def mentions(self, service: str) -> bool:
        pattern = names(service)
        return bool(pattern.search(self.nat) or pattern.search(self.filter))

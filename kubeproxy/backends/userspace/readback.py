"""What a userspace-mode node does with each service port, read back (model/rules_readback.py):
its redirect rules and its relay.

The redirect rules name the service port (upstream's comment `ns/name:port`) but not its
endpoints: those live in the proxy's relay. The proxy writes them after every sync to its state
file (backends/userspace/proxier.py: one file per network namespace, named by its inode), so
the snapshot reads both, inside the node: a port "goes to" an endpoint when a redirect for the
port is in the nat table and the relay balances it over that endpoint.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubeproxy.backends.iptables.apply import iptables_tool
from kubeproxy.backends.userspace.proxier import STATE_DIR, state_path
from kubeproxy.backends.userspace.render import KUBE_PORTALS_CONTAINER
from kubeproxy.model.options import Family
from kubeproxy.model.rules_readback import NodeRules, Run, ServicePortKeys, names


def read_rules(run: Run, ports: Mapping[str, ServicePortKeys], family: Family = Family.IPV4) -> NodeRules:
    """The redirects of `family` name every port, so the keys are not needed."""
    return UserspaceRules.read(run, family)


@dataclass
class UserspaceRules:
    nat: str
    state: dict[str, Any]

    @classmethod
    def read(cls, run: Run, family: Family = Family.IPV4) -> UserspaceRules:
        link = str(run(["readlink", "/proc/self/ns/net"]).stdout).strip()
        path = state_path(STATE_DIR, link[link.find("[") + 1 : link.rfind("]")])
        proc = run(["cat", str(path)], check=False)
        try:
            state = json.loads(proc.stdout) if proc.returncode == 0 else {}
        except json.JSONDecodeError:
            state = {}  # caught between two writes cannot happen (rename), but a bad file must not crash a wait
        return cls(str(run([iptables_tool(family, suffix="-save"), "-t", "nat"]).stdout), state)

    @property
    def text(self) -> str:
        return self.nat + json.dumps(self.state, indent=1)

    def _redirected(self, service_port: str) -> bool:
        for line in self.nat.splitlines():
            if line.startswith(f"-A {KUBE_PORTALS_CONTAINER} "):
                words = shlex.split(line)
                if words[words.index("--comment") + 1] == service_port:
                    return True
        return False

    def _port(self, service_port: str) -> dict[str, Any] | None:
        port: dict[str, Any] | None = self.state.get("ports", {}).get(service_port)
        return port if port is not None and self._redirected(service_port) else None

    def endpoints(self, service_port: str) -> set[str]:
        port = self._port(service_port)
        return set(port["endpoints"]) if port else set()

    def rejects(self, service_port: str) -> bool:
        """Redirected to a relay with no endpoint, which resets each connection."""
        port = self._port(service_port)
        return port is not None and not port["endpoints"]

    def mentions(self, service: str) -> bool:
        pattern = names(service)
        return bool(pattern.search(self.nat)) or any(pattern.match(name) for name in self.state.get("ports", {}))

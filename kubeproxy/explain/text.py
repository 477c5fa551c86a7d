"""`kubeproxy explain`'s output: text for a person, JSON for a program."""

from __future__ import annotations

from typing import Any

from kubeproxy.explain.service_walk import AddressPath, Explanation
from kubeproxy.netfilter.simulate.result_text import prob_text


def _where(table: str, chain: str, line: int) -> str:
    return f"{table} {chain}" + (f" (line {line})" if line else "")


def _path_lines(p: AddressPath) -> list[str]:
    out = [f"  {p.frontend.address} ({p.frontend.kind}), a new flow from outside:"]
    if p.error:
        return [*out, f"    not traced: {p.error}"]
    out += [f"    {_where(s.table, s.chain, s.line)}: {s.text}" for s in p.steps]
    out += [f"    element of {e.table} {e.set}: {e.text}" for e in p.elements]
    if p.relay:
        out.append(f"    relay (the userspace proxy) on {p.relay}")
    for d in p.destinations:
        out.append(f"    -> {d.where}  {prob_text(d.share)}" + ("  (masqueraded)" if d.masqueraded else ""))
    return out


def render_text(exp: Explanation) -> str:
    if not exp.ports:
        return f"Service {exp.service}: no port of it is in the objects or the rules given\n"
    lines: list[str] = []
    for port in exp.ports:
        lines.append(f"Service {port.name} ({port.family}):")
        for p in port.paths:
            lines += _path_lines(p)
        if port.health_check_node_port:
            lines.append(f"  health check node port {port.health_check_node_port}: answered by the proxy itself "
                         "(200 with a local endpoint, 503 without)")
        lines.append("")
    return "\n".join(lines)


def to_json(exp: Explanation) -> dict[str, Any]:
    return {
        "service": exp.service,
        "ports": [{
            "name": str(port.name), "family": str(port.family), "health_check_node_port": port.health_check_node_port,
            "addresses": [{
                "address": p.frontend.address, "kind": p.frontend.kind, "error": p.error or None,
                "steps": [{"table": s.table, "chain": s.chain, "rule": s.text, "line": s.line or None} for s in p.steps],
                "elements": [{"table": e.table, "set": e.set, "element": e.text} for e in p.elements],
                "relay": p.relay or None,
                "destinations": [{"to": d.where, "share": float(d.share), "masqueraded": d.masqueraded}
                                 for d in p.destinations],
            } for p in port.paths],
        } for port in exp.ports],
    }

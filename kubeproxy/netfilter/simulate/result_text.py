"""Trace results in plain words, and as JSON."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from kubeproxy.netfilter import addr as A
from kubeproxy.netfilter.packet import Packet
from kubeproxy.netfilter.simulate import Outcome, TraceResult


def _hp(ip: int, port: int | None, v6: bool = False) -> str:
    s = A.fmt_ip(ip, v6)
    if port is None:
        return s
    return f"[{s}]:{port}" if v6 else f"{s}:{port}"


def prob_text(p: Fraction) -> str:
    pct = f"{float(p) * 100:.4g}%"
    if p.denominator <= 1000:
        return f"{pct} ({p})" if p != 1 else "100%"
    return pct


def packet_text(pkt: Packet) -> str:
    proto = A.PROTO_NAMES.get(pkt.proto, str(pkt.proto))
    has_ports = pkt.proto in (6, 17, 132, 136, 33)
    src = _hp(pkt.src, pkt.sport if has_ports else None, pkt.v6)
    dst = _hp(pkt.dst, pkt.dport if has_ports else None, pkt.v6)
    where = "sent by a process on this host" if pkt.from_host else f"arriving on {pkt.in_iface}"
    state = "" if pkt.ct_state == "NEW" else f", conntrack {pkt.ct_state}"
    return f"{proto} {src} -> {dst}, {where}{state}"


def verdict_text(o: Outcome, pkt: Packet) -> str:
    """One sentence: where the packet ends and what happened to its addresses."""
    has_ports = pkt.proto in (6, 17, 132, 136, 33)
    last = o.path[-1] if o.path else None
    by = ""
    if last is not None:
        by = (f" by the {last.table} {last.chain} policy" if last.rule == "policy"
              else f" by {last.table} {last.chain} rule {last.rule}")
    if o.verdict == "DROP":
        why = f": {o.notes[-1]}" if o.notes and not by else ""
        return f"dropped{by}{why}"
    if o.verdict == "REJECT":
        return f"rejected ({o.reject_with}){by}: the sender gets an error"
    if o.verdict == "UNKNOWN":
        return f"unknown: sent{by.replace(' by ', ' from ', 1)} to a chain or target the tracer cannot follow"
    if o.verdict == "UNTRACED":
        return (f"not followed{by.replace(' by ', ' past ', 1)}: the tracer's branch budget ran out, so where this "
                "share of the packets goes is not known")
    if o.verdict == "QUEUE":
        return f"queued to userspace{by}: its fate is decided by a program, not the rules"
    parts: list[str] = []
    if o.dnat is not None:
        parts.append(f"DNAT to {_hp(o.dnat[0], o.dnat[1] if has_ports else None, o.v6)}")
    if o.local:
        where = f"delivered to a local process on {_hp(o.dst, o.dport if has_ports else None, o.v6)}"
        parts.append(("then " if parts else "") + where)
        text = ", ".join(parts)
        if o.snat is not None or o.masquerade:
            text += f"; source changed to {A.fmt_ip(o.src, o.v6)}"
        return text
    client = A.fmt_ip(pkt.src, pkt.v6)
    if o.masquerade:
        parts.append(f"{'then ' if parts else ''}masqueraded to {A.fmt_ip(o.src, o.v6)} on {o.out_iface}")
        tail = f"the receiver sees the node ({A.fmt_ip(o.src, o.v6)}), not the client ({client})"
    elif o.snat is not None:
        parts.append(f"{'then ' if parts else ''}SNAT to {A.fmt_ip(o.src, o.v6)} out {o.out_iface}")
        tail = f"the receiver sees {A.fmt_ip(o.src, o.v6)}, not the client ({client})"
    else:
        tail = f"the receiver sees the client's own address ({client})"
    if not parts:
        parts.append(f"sent unchanged out {o.out_iface} to {_hp(o.dst, o.dport if has_ports else None, o.v6)}")
    elif not (o.masquerade or o.snat is not None):
        parts.append(f"out {o.out_iface}")
    return ", ".join(parts) + ": " + tail


def render_text(res: TraceResult) -> str:
    pkt = res.packet
    lines = [f"Packet: {packet_text(pkt)}", ""]
    n = len(res.outcomes)
    if any(o.unknown for o in res.outcomes):
        lines += ["The dump has matches or targets the tracer cannot evaluate: there is an outcome for",
                  "each answer, and each outcome's chance holds given its assumptions.", ""]
    for k, o in enumerate(res.outcomes, 1):
        lines.append(f"Outcome {k}/{n}: {prob_text(o.probability)}: {o.verdict}")
        width = max((len(f"{h.table} {h.chain} #{h.rule}") for h in o.path), default=0)
        for h in o.path:
            where = f"{h.table} {h.chain} #{h.rule}"
            loc = f" (line {h.line})" if h.line else ""
            lines.append(f"  {where.ljust(width)}  [{h.hook}] -> {h.target or '(no target)'}{loc}")
            if h.text and h.rule != "policy":
                lines.append(f"  {' ' * width}    {h.text}")
        lines.append(f"  => {verdict_text(o, pkt)}")
        for u in o.unknown:
            lines.append(f"  unknown: {u.table} {u.chain} #{u.rule} (line {u.line}) `{u.what}`: "
                         f"this outcome assumes it {u.assumed}")
        for note in o.notes:
            lines.append(f"  note: {note}")
        lines.append("")
    for note in res.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines).rstrip() + "\n"


def to_json(res: TraceResult) -> dict[str, Any]:
    pkt = res.packet
    has_ports = pkt.proto in (6, 17, 132, 136, 33)
    outs = []
    for o in res.outcomes:
        outs.append({
            "probability": float(o.probability),
            "probability_exact": str(o.probability),
            "verdict": o.verdict,
            "dnat": _hp(o.dnat[0], o.dnat[1] if has_ports else None, o.v6) if o.dnat else None,
            "masquerade": o.masquerade,
            "snat": A.fmt_ip(o.src, o.v6) if (o.snat is not None or o.masquerade) else None,
            "out_iface": o.out_iface,
            "local": o.local,
            "src": _hp(o.src, o.sport if has_ports else None, o.v6),
            "dst": _hp(o.dst, o.dport if has_ports else None, o.v6),
            "reject_with": o.reject_with or None,
            "explanation": verdict_text(o, pkt),
            "path": [
                {"table": h.table, "chain": h.chain, "rule": h.rule, "target": h.target, "hook": h.hook,
                 "line": h.line, "text": h.text}
                for h in o.path
            ],
            "notes": o.notes,
            "unknown": [
                {"table": u.table, "chain": u.chain, "rule": u.rule, "line": u.line, "text": u.text,
                 "hook": u.hook, "what": u.what, "assumed": u.assumed}
                for u in o.unknown
            ],
        })
    return {"packet": packet_text(pkt), "outcomes": outs, "notes": res.notes}

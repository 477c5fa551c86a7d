"""A finding: what is wrong (or at risk), the evidence, and the fixes, best first."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Worst first; the text output and the JSON keep this order.
SEVERITIES = ("critical", "warning", "info")


@dataclass
class Finding:
    """`kind` is stable (for scripts); `subject` names the object (`Service ns/name:port`, a chain).

    `score` orders findings of one severity: lower is worse (for SNAT, the predicted rate at which
    the health check fails, so the service that collapses first comes first)."""

    severity: str
    kind: str
    subject: str
    title: str
    evidence: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    score: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "kind": self.kind,
            "subject": self.subject,
            "title": self.title,
            "evidence": list(self.evidence),
            "fixes": list(self.fixes),
            "data": dict(self.data),
        }


def ordered(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.score, f.kind, f.subject))


@dataclass
class Report:
    findings: list[Finding]
    inputs: dict[str, Any] = field(default_factory=dict)  # what was read: source, counts, facts
    notes: list[str] = field(default_factory=list)  # what could not be checked, and why

    def to_json(self) -> dict[str, Any]:
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in SEVERITIES}
        return {
            "version": 1,
            "inputs": self.inputs,
            "summary": counts,
            "findings": [f.to_json() for f in self.findings],
            "notes": list(self.notes),
        }

    def text(self) -> str:
        lines: list[str] = []
        if not self.findings:
            lines.append("no findings")
        for i, f in enumerate(self.findings, 1):
            lines.append(f"{i}. [{f.severity.upper()}] {f.subject}: {f.title}")
            lines.extend(f"     evidence: {e}" for e in f.evidence)
            lines.extend(f"     fix {n}: {fix}" for n, fix in enumerate(f.fixes, 1))
        if self.notes:
            lines.append("")
            lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines) + "\n"

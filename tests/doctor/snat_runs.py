"""The DNS lab's ramps (`kubeproxy lab dns`) that doctor's SNAT prediction is compared with.

FITTED are the runs doctor's 0.86 (HEALTHY_FRACTION) was derived from (docs/labs.md, "The
capacity rule"): a prediction compared with them checks how the rule scales, not whether it
predicts. HELD_OUT were predicted before they were run (bench/snat_prediction.py; the committed
bench/snat_prediction*.txt tables came first), at conditions the fraction never saw. The rates
bracket the onset: every health check passed at `max_healthy`; at `first_failing` checks failed
and the node counted SNAT drops (conntrack insert failures). Every run carried the lab's own
health check, CHECK_RATE new masqueraded flows/s besides the ramp's load.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LabRun:
    name: str
    scenario: str
    max_healthy: float
    first_failing: float
    udp_timeout: int | None = None  # None: the kernel's 30 s
    pods: int = 1
    snat_ports: tuple[int, int] | None = None  # a MASQUERADE --to-ports range ahead of the proxy's

    @property
    def node_timeout(self) -> int:
        return self.udp_timeout or 30


FITTED = (
    LabRun("timeout-30", "snat", 1600, 1800),
    LabRun("timeout-60", "snat", 800, 900, udp_timeout=60),
    LabRun("nft-ct-timeout-5", "nft-ct-timeout", 10_000, 12_000),  # the Service's 5 s, the node's 30 s
)

HELD_OUT = (
    LabRun("timeout-45", "snat", 1200, 1300, udp_timeout=45),
    LabRun("pods-2", "snat", 3600, 3800, pods=2),
    LabRun("ports-10k", "snat", 175, 225, snat_ports=(40000, 49999)),
    LabRun("nft-30", "nftables", 1800, 1900),
    LabRun("ports-5k", "snat", 40, 60, snat_ports=(40000, 44999)),
    LabRun("pods-2-ports-10k", "snat", 450, 500, pods=2, snat_ports=(40000, 49999)),
    LabRun("pods-3-ports-3k", "snat", 160, 180, pods=3, snat_ports=(40000, 42999)),
    LabRun("ports-5k-15", "snat", 200, 220, udp_timeout=15, snat_ports=(40000, 44999)),
    LabRun("ports-20k-60", "snat", 200, 220, udp_timeout=60, snat_ports=(40000, 59999)),
)

# The lab's health check: 100 queries/s through the Service, as masqueraded as the ramp's load.
CHECK_RATE = 100.0


def error(predicted: float, run: LabRun) -> float:
    """The prediction's error against the measured max healthy rate (the fitted runs' convention)."""
    return (predicted - run.max_healthy) / run.max_healthy

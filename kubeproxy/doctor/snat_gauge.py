"""The SNAT gauge for doctor: the core lives in kubeproxy.proxy.snat_watch, shared with `kubeproxy run --snat-watch`.

One sample counts the masqueraded conntrack entries per endpoint ip:port (reply tuple from the
endpoint to one of the node's addresses, which is not the flow's own source) and compares each
count with the SNAT port space; the cost per sample is measured by bench/doctor_snat_watch.py.
"""

from __future__ import annotations

from kubeproxy.proxy.snat_watch import (
    SNAT_PORTS,
    Gauge,
    masqueraded_endpoints,
    sample,
    sample_dump,
    sample_text,
    warnings,
)

__all__ = ["SNAT_PORTS", "Gauge", "masqueraded_endpoints", "sample", "sample_dump", "sample_text", "warnings"]

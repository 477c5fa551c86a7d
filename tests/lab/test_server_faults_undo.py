"""A fault that fails midway puts the control plane back (lab/server_faults.py): every undo is
tried even when one fails (a server that is down refuses it), and the failure names which."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from kubeproxy.lab.cluster import ClusterError
from kubeproxy.lab.server_faults import FaultBed
from kubeproxy.lab.side_by_side import SideBySide


def test_every_undo_is_tried_and_the_failed_ones_named() -> None:
    faults = FaultBed(cast(SideBySide, None), Path("token"), Path("kubeconfig"))
    ran: list[str] = []

    def refused() -> None:
        ran.append("rbac")
        raise OSError("connection refused")

    faults._undo |= {"apf": lambda: ran.append("apf"), "rbac": refused, "token": lambda: ran.append("token")}
    with pytest.raises(ClusterError, match=r"not put back: rbac: connection refused$"):
        faults.undo_all()
    assert sorted(ran) == ["apf", "rbac", "token"]
    assert faults._undo == {}
    faults.undo_all()  # nothing left: nothing runs again
    assert len(ran) == 3

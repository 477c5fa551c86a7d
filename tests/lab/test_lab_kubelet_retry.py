"""The lab kubelet sends a write again while kube-apiserver answers that etcd timed out (a loaded
machine), and takes the write as made when the retry finds it done; any other error is raised."""

from __future__ import annotations

import httpx2
import pytest

from kubeproxy.lab.kubelet import ETCD_TIMEOUT_TRIES, KubeletError, LabKubelet, PodInfo

POD = PodInfo("web-0", "node-a", ("10.244.1.10",), {"app": "web"})
TIMED_OUT = httpx2.Response(500, json={"kind": "Status", "status": "Failure", "message": "etcdserver: request timed out"})


def kubelet(answers: list[httpx2.Response], seen: list[str]) -> LabKubelet:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request.method)
        return answers.pop(0)

    return LabKubelet(httpx2.Client(base_url="https://api.test", transport=httpx2.MockTransport(handler)))


def test_a_delete_that_timed_out_and_then_finds_the_pod_gone_is_done() -> None:
    seen: list[str] = []
    kubelet([TIMED_OUT, httpx2.Response(404, json={"kind": "Status"})], seen).finish_termination(POD)
    assert seen == ["DELETE", "DELETE"]


def test_a_create_that_timed_out_and_then_finds_the_pod_made_is_done() -> None:
    seen: list[str] = []
    answers = [TIMED_OUT, httpx2.Response(409, json={"kind": "Status"}), httpx2.Response(200, json={})]
    kubelet(answers, seen).report_pod(POD)
    assert seen == ["POST", "POST", "PATCH"]


def test_etcd_timing_out_on_every_try_is_raised() -> None:
    seen: list[str] = []
    with pytest.raises(KubeletError, match="etcdserver: request timed out"):
        kubelet([TIMED_OUT] * ETCD_TIMEOUT_TRIES, seen).set_ready(POD, True)
    assert len(seen) == ETCD_TIMEOUT_TRIES


def test_a_first_answer_of_404_or_another_error_is_raised_at_once() -> None:
    for answer in (httpx2.Response(404, json={}), httpx2.Response(500, json={"message": "other"})):
        seen: list[str] = []
        with pytest.raises(KubeletError):
            kubelet([answer], seen).finish_termination(POD)
        assert seen == ["DELETE"]

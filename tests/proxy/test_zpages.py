"""/configz, /flagz and /statusz on the metrics port against upstream kube-proxy v1.37.2's own
answers (tests/fixtures/upstream_operator/README.md says how each was recorded)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping

import pytest

from kubeproxy.backends import registry
from kubeproxy.proxy import flags
from kubeproxy.proxy.health import serve_metrics
from kubeproxy.proxy.http import Response
from kubeproxy.proxy.zpages import ZPages, flag_values, negotiate
from tests.paths import TESTS

FIXTURES = TESTS / "fixtures" / "upstream_operator"
# The command line of the recorded nftables run (flagz.txt, configz_nftables.json).
NFTABLES_RUN = ["--master=http://127.0.0.1:18080", "--kube-api-content-type=application/json",
                "--hostname-override=node-a", "--proxy-mode=nftables", "-v=2"]  # fmt: skip
GIVEN_RUN = ["--master=http://127.0.0.1:18080", "--kube-api-content-type=application/json", "--hostname-override=node-a",
             "--feature-gates=KubeProxyIPVS=false,AllAlpha=false", "--feature-gates=ComponentStatusz=true",
             "--nodeport-addresses=10.0.0.0/8,primary", "--ipvs-exclude-cidrs=10.1.0.0/16",
             "--ipvs-exclude-cidrs=10.2.0.0/16", "--cluster-cidr=10.244.0.0/16", "--kube-api-qps=7.5",
             "--healthz-port=10256", "--vmodule=a=2"]  # fmt: skip
STARTED = 1_795_864_366.0  # Sat Nov 28 11:12:46 UTC 2026, as in statusz.txt
OURS = {f.name for f in flags.FLAGS if f.ours}


def pages(args: list[str], *, now: float = STARTED + 5) -> ZPages:
    parsed = flags.parse(args)
    return ZPages(flags.resolve(parsed).cfg, flag_values(parsed.values), STARTED, clock=lambda: now)


def body_text(response: Response) -> str:
    return response.body.decode()


def upstream_lines(text: str) -> list[str]:
    """flagz text without kubeproxy's own flags."""
    return [line for line in text.split("\n") if line.partition(":")[0] not in OURS]


def test_configz_is_upstreams_document_byte_for_byte() -> None:
    response = pages(NFTABLES_RUN).configz("GET", "/configz", {})
    assert response.body == (FIXTURES / "configz_nftables.json").read_bytes()
    assert response.headers == {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}


def test_flagz_text_is_upstreams_plus_our_own_flags() -> None:
    response = pages(NFTABLES_RUN).flagz("GET", "/flagz", {})
    assert response.headers == {"Content-Type": "text/plain; charset=utf-8"}
    assert upstream_lines(body_text(response)) == (FIXTURES / "flagz.txt").read_text().split("\n")
    assert {line.partition(":")[0] for line in body_text(response).split("\n")[3:-1]} >= OURS


def test_flagz_shows_given_values_as_pflag_writes_them() -> None:
    ours = upstream_lines(body_text(pages(GIVEN_RUN).flagz("GET", "/flagz", {})))
    upstream = (FIXTURES / "flagz_given.txt").read_text().split("\n")
    # Upstream's value drops the keyword here (its flag shows another copy of the list); ours
    # shows the command line.
    assert upstream[upstream.index("nodeport-addresses:[10.0.0.0/8]")] == "nodeport-addresses:[10.0.0.0/8]"
    upstream[upstream.index("nodeport-addresses:[10.0.0.0/8]")] = "nodeport-addresses:[10.0.0.0/8,primary]"
    assert ours == upstream


@pytest.mark.parametrize(("version", "fixture"), [("v1alpha1", "flagz_v1alpha1.json"),
                                                  ("v1beta1", "flagz_v1beta1_iptables.json")])  # fmt: skip
def test_flagz_json_is_upstreams(version: str, fixture: str) -> None:
    args = NFTABLES_RUN if version == "v1alpha1" else [a for a in NFTABLES_RUN if a not in ("--proxy-mode=nftables", "-v=2")]
    accept = f"application/json;as=Flagz;v={version};g=config.k8s.io"
    response = pages(args).flagz("GET", "/flagz", {"accept": accept})
    assert response.headers["Content-Type"] == f"application/json;g=config.k8s.io;v={version};as=Flagz"
    warning = '299 - "This version of the flagz endpoint is deprecated. Please use a newer version."'
    assert response.headers.get("Warning") == (warning if version == "v1alpha1" else None)
    doc = json.loads(response.body)
    doc["flags"] = {name: value for name, value in doc["flags"].items() if name not in OURS}
    assert json.dumps(doc, indent=2) == (FIXTURES / fixture).read_text()


def statusz_fixture() -> str:
    return (FIXTURES / "statusz.txt").read_text().replace("Go version  go1.26.8", "Go version  ")


def test_statusz_text_is_upstreams_with_kubeproxys_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded run was on a UTC host; Started is local time, as Go's time.UnixDate."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        response = pages(NFTABLES_RUN).statusz("GET", "/statusz", {})
    finally:
        monkeypatch.undo()
        time.tzset()
    assert response.headers == {"Content-Type": "text/plain; charset=utf-8"}
    assert body_text(response) == statusz_fixture()


def test_statusz_counts_uptime_by_the_clock() -> None:
    text = body_text(pages(NFTABLES_RUN, now=STARTED + 3 * 3600 + 62).statusz("GET", "/statusz", {}))
    assert "\nUp  3 hr 01 min 02 sec\n" in text


def test_statusz_json_is_upstreams_shape() -> None:
    accept = "application/json;as=Statusz;v=v1beta1;g=config.k8s.io"
    response = pages(NFTABLES_RUN).statusz("GET", "/statusz", {"accept": accept})
    upstream = json.loads((FIXTURES / "statusz_v1beta1.json").read_text())
    upstream["goVersion"] = ""
    upstream["startTime"] = "2026-11-28T11:12:46Z"
    assert response.body.decode() == json.dumps(upstream, indent=2)


def test_flagz_yaml_when_asked_for() -> None:
    response = pages(NFTABLES_RUN).flagz("GET", "/flagz", {"accept": "application/yaml;as=Flagz;v=v1beta1;g=config.k8s.io"})
    assert response.headers["Content-Type"] == "application/yaml;g=config.k8s.io;v=v1beta1;as=Flagz"
    text = body_text(response)
    assert text.startswith("apiVersion: config.k8s.io/v1beta1\nflags:\n  bind-address: 0.0.0.0\n")
    assert '  bind-address-hard-fail: "false"\n' in text


@pytest.mark.parametrize(
    ("accept", "chosen"),
    [
        ("", ("text", "")),
        ("*/*", ("text", "")),
        ("text/plain", ("text", "")),
        ("text/plain;q=0.5, application/json", ("text", "")),
        ("application/json;as=Flagz;v=v1beta1;g=config.k8s.io;q=0.1, text/plain", ("text", "")),
        ("text/html, application/json;as=Flagz;v=v1beta1;g=config.k8s.io", ("json", "v1beta1")),
        ("application/json", None),
        ("text/html", None),
        ("application/json;as=Flagz;v=v1beta1", None),
        ("application/json;as=Flagz;v=v1;g=config.k8s.io", None),
        ("application/json;as=Statusz;v=v1beta1;g=config.k8s.io", None),
        ("text/plain;q=0", None),
    ],
)
def test_accept_negotiation_as_upstream_answered(accept: str, chosen: tuple[str, str] | None) -> None:
    assert negotiate(accept, "Flagz") == chosen


def test_not_acceptable_is_upstreams_status() -> None:
    response = pages(NFTABLES_RUN).flagz("GET", "/flagz", {"accept": "application/json"})
    assert response.status == 406 and response.headers == {"Content-Type": "application/json"}
    assert response.body == (FIXTURES / "not_acceptable.json").read_bytes()


def test_gates_turn_flagz_and_statusz_off_but_not_configz() -> None:
    on = pages(NFTABLES_RUN)
    assert sorted(on.routes()) == ["/configz", "/flagz", "/statusz"]
    assert on.paths() == ["/configz", "/flagz", "/healthz", "/metrics", "/proxyMode"]
    off = pages([*NFTABLES_RUN, "--feature-gates=ComponentFlagz=false,ComponentStatusz=false"])
    expected = dict(line.split() for line in (FIXTURES / "gated_off.txt").read_text().splitlines())
    assert {path: "200" if f"/{path}" in off.routes() else "404" for path in expected} == expected


async def fetch(port: int, path: str, accept: str = "") -> tuple[int, Mapping[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    extra = f"Accept: {accept}\r\n" if accept else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
    answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


def test_the_metrics_server_serves_the_pages() -> None:
    zpages = pages(NFTABLES_RUN)

    async def main() -> None:
        server = await serve_metrics(registry.proxy_metrics("nftables"), "127.0.0.1:0", "nftables", pages=zpages.routes())
        port = server.sockets[0].getsockname()[1]
        try:
            status, _, body = await fetch(port, "/configz")
            assert (status, body) == (200, (FIXTURES / "configz_nftables.json").read_bytes())
            status, _, body = await fetch(port, "/statusz?x=1", "application/json;as=Statusz;v=v1beta1;g=config.k8s.io")
            assert status == 200 and json.loads(body)["kind"] == "Statusz"
            status, _, body = await fetch(port, "/flagz", "application/json")
            assert status == 406
            assert (await fetch(port, "/statusz/"))[0] == 404
            assert re.search(rb"^proxy-mode:nftables$", (await fetch(port, "/flagz"))[2], re.M)
        finally:
            server.close()

    asyncio.run(main())

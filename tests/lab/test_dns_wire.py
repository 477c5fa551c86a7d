"""DNS wire format, addresses and summaries: pure functions, plus `dig` as an outside parser of our answers."""

from __future__ import annotations

import re
import shutil
import socket
import struct
import subprocess

import pytest

from kubeproxy.lab.dns.dns_message import WireError, Zone, answer, encode_name, make_query, parse_qtype, response_rcode
from kubeproxy.lab.dns.endpoints import AddressError, parse_server, source_addresses
from kubeproxy.lab.dns.responder import Responder
from kubeproxy.lab.dns.stats import Summary, format_duration, percentile


def test_query_bytes_are_rfc1035() -> None:
    q = make_query("www.lab.test", "A")
    packet = q.packet(0xBEEF)
    assert packet[:2] == b"\xbe\xef"
    flags, qd, an, ns, ar = struct.unpack("!HHHHH", packet[2:12])
    assert (flags, qd, an, ns, ar) == (0x0100, 1, 0, 0, 0)  # RD only
    assert packet[12:] == b"\x03www\x03lab\x04test\x00" + b"\x00\x01\x00\x01"
    assert q.name == "www.lab.test."
    assert make_query("www.lab.test.", "AAAA").question[-4:] == b"\x00\x1c\x00\x01"


def test_answer_in_zone_out_of_zone_and_garbage() -> None:
    zone = Zone("lab.test.", "192.0.2.7", ttl=60)
    q = make_query("a.b.LAB.test", "A")
    resp = answer(q.packet(7), zone)
    assert resp is not None
    qid, flags, qd, an, ns, ar = struct.unpack("!HHHHHH", resp[:12])
    assert (qid, qd, an, ns, ar) == (7, 1, 1, 0, 0)
    assert flags & 0x8000 and flags & 0x0400 and flags & 0x0100 and flags & 0xF == 0  # QR AA RD, NOERROR
    assert resp.endswith(struct.pack("!HHHIH", 0xC00C, 1, 1, 60, 4) + socket.inet_aton("192.0.2.7"))
    assert response_rcode(resp, b"\x00\x07", q.question) == 0

    refused = answer(make_query("example.com").packet(8), zone)
    assert refused is not None and refused[3] & 0xF == 5 and refused[6:8] == b"\x00\x00"
    nodata = answer(make_query("x.lab.test", "AAAA").packet(9), zone)
    assert nodata is not None and nodata[3] & 0xF == 0 and nodata[6:8] == b"\x00\x00"

    assert answer(b"\x00\x01", zone) is None
    assert answer(resp, zone) is None  # a response is not answered
    assert answer(q.packet(1)[:-3], zone) is None  # question cut short


def test_response_must_match_id_question_and_be_a_response() -> None:
    q = make_query("www.lab.test")
    resp = answer(q.packet(0x1234), Zone())
    assert resp is not None
    assert response_rcode(resp, b"\x12\x34", q.question) == 0
    assert response_rcode(resp, b"\x12\x35", q.question) is None
    assert response_rcode(resp, b"\x12\x34", make_query("www2.lab.test").question) is None
    assert response_rcode(resp, b"\x12\x34", make_query("www.lab.test", "AAAA").question) is None
    assert response_rcode(q.packet(0x1234), b"\x12\x34", q.question) is None  # the query itself (QR clear)
    assert response_rcode(resp[:14], b"\x12\x34", q.question) is None
    # Resolvers may randomise letter case (0x20); the name still matches, the type must not.
    mixed = resp.replace(b"\x03www\x03lab", b"\x03WwW\x03lAb")
    assert response_rcode(mixed, b"\x12\x34", q.question) == 0


@pytest.mark.parametrize(
    ("name", "message"),
    [("a..b", "empty label"), ("x" * 64 + ".test", "longer than 63"), ("bücher.test", "ASCII"), ("a." * 128, "255")],
)
def test_bad_names(name: str, message: str) -> None:
    with pytest.raises(WireError, match=message):
        encode_name(name)


def test_qtypes() -> None:
    assert parse_qtype("a") == 1 and parse_qtype("AAAA") == 28 and parse_qtype("TYPE65") == 65 and parse_qtype("99") == 99
    with pytest.raises(WireError, match="unknown record type 'BOGUS'"):
        parse_qtype("BOGUS")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("10.0.0.10", ("10.0.0.10", 53)), ("10.0.0.10:5353", ("10.0.0.10", 5353)), ("::1", ("::1", 53)),
     ("[fd00::a]:54", ("fd00::a", 54)), (" 127.0.0.1:1 ", ("127.0.0.1", 1))],
)  # fmt: skip
def test_parse_server(text: str, expected: tuple[str, int]) -> None:
    assert parse_server(text) == expected


@pytest.mark.parametrize("text", ["dns.example", "10.0.0.1:0", "10.0.0.1:65536", "10.0.0.1:", "[::1", "[::1]x", "1.2.3.4:ab"])
def test_parse_server_rejects(text: str) -> None:
    with pytest.raises(AddressError, match=re.escape(repr(text))):
        parse_server(text)


def _bindable(ip: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((ip, 0))
        except OSError:
            return False
    return True


def _absent_network() -> str:
    """A /30 of the benchmarking range (198.18.0.0/15) with no local address on this host."""
    for third in range(256):
        if not _bindable(f"198.18.{third}.1") and not _bindable(f"198.18.{third}.2"):
            return f"198.18.{third}.0/30"
    pytest.skip("every probed 198.18.x.0/30 has a local address")


def test_source_addresses_are_hosts_of_the_cidr_and_must_be_local() -> None:
    assert source_addresses("127.0.3.0/29", socket.AF_INET) == tuple(f"127.0.3.{i}" for i in range(1, 7))
    assert source_addresses("127.0.3.9/32", socket.AF_INET) == ("127.0.3.9",)
    absent = _absent_network()
    first = absent.removesuffix("0/30") + "1"
    with pytest.raises(
        AddressError, match=rf"{re.escape(absent)}: 2 of 2 addresses are not assigned .*first: {re.escape(first)}\)"
    ):
        source_addresses(absent, socket.AF_INET)
    with pytest.raises(AddressError, match="IPv6 sources for an IPv4 server"):
        source_addresses("::1/128", socket.AF_INET)
    with pytest.raises(AddressError, match="not-a-cidr"):
        source_addresses("not-a-cidr", socket.AF_INET)
    with pytest.raises(AddressError, match="at most 65536"):
        source_addresses("10.0.0.0/8", socket.AF_INET)


def test_percentiles_are_nearest_rank_samples() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, p) for p in (50, 90, 99, 100)] == [50.0, 90.0, 99.0, 100.0]
    assert percentile([3.0], 99) == 3.0
    s = Summary.of([0.004, 0.001, 0.002, 0.003])
    assert s is not None and (s.p50, s.max, s.count) == (0.002, 0.004, 4)
    assert Summary.of([]) is None
    assert [format_duration(x) for x in (1.0, 0.5, 1.5, 0.00025, 0.0)] == ["1s", "500ms", "1.5s", "250us", "0s"]


@pytest.mark.skipif(shutil.which("dig") is None, reason="dig (apt bind9-dnsutils) is not installed")
def test_dig_reads_our_responder() -> None:
    with Responder(zone=Zone("lab.test.", "192.0.2.99")) as r:
        host, port = r.address
        out = subprocess.run(
            ["dig", "+time=2", "+tries=1", "-p", str(port), f"@{host}", "Host1.Lab.Test", "A"],
            capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
    assert "status: NOERROR" in out.stdout, out.stdout + out.stderr
    assert "flags: qr aa rd" in out.stdout
    assert "192.0.2.99" in out.stdout.split("ANSWER SECTION:")[1]

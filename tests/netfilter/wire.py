"""One-way observation of first packets, for the corpus harness (run inside a namespace).

    python wire.py sniff IFACE          prints `ready`, then one JSON line per IPv4 TCP/UDP packet
                                        arriving on IFACE: {"proto", "src", "sport", "dst", "dport"}
    python wire.py listen PROTO IP:PORT [...]
                                        prints `ready`, then one JSON line per datagram / accepted
                                        connection: the same fields, as the local socket saw them
    python wire.py send JSON            JSON: [[proto, src, sport, dst, dport], ...]; sends every
                                        probe at once (one new flow each) and prints, per probe,
                                        "refused", "timeout" or "sent" after a short wait

The sniffer reads the wire (AF_PACKET, before the receiving host's own netfilter), so what it
reports is the packet as the node under test sent it, whatever happens to replies: the tracer
models the first packet of a flow, and so does this.
"""

from __future__ import annotations

import errno
import json
import select
import socket
import struct
import sys
import time

ETH_P_IP = 0x0800
PACKET_OUTGOING = 4


def _ip(b: bytes) -> str:
    return socket.inet_ntoa(b)


def sniff(iface: str) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_IP))
    s.bind((iface, 0))
    print("ready", flush=True)
    while True:
        data, addr = s.recvfrom(65535)
        if addr[2] == PACKET_OUTGOING or len(data) < 20:
            continue
        ihl = (data[0] & 15) * 4
        proto = data[9]
        if proto not in (6, 17) or len(data) < ihl + 4:
            continue
        sport, dport = struct.unpack("!HH", data[ihl : ihl + 4])
        if proto == 6 and len(data) >= ihl + 14 and not (data[ihl + 13] & 0x02):
            continue  # only SYNs: the first packet of a TCP flow
        print(json.dumps({"proto": "tcp" if proto == 6 else "udp", "src": _ip(data[12:16]), "sport": sport,
                          "dst": _ip(data[16:20]), "dport": dport}), flush=True)


def listen(proto: str, specs: list[str]) -> None:
    socks = []
    for spec in specs:
        host, _, port = spec.rpartition(":")
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, int(port)))
        if proto == "tcp":
            s.listen(128)
        socks.append(s)
    print("ready", flush=True)
    while True:
        ready, _, _ = select.select(socks, [], [])
        for s in ready:
            here = s.getsockname()
            if proto == "udp":
                _, peer = s.recvfrom(2048)
            else:
                conn, peer = s.accept()
                conn.close()
            print(json.dumps({"proto": proto, "src": peer[0], "sport": peer[1], "dst": here[0], "dport": here[1]}),
                  flush=True)


def send(probes: list[list[str | int]], wait: float = 0.6) -> None:
    socks: list[socket.socket | None] = []
    result: list[str] = []
    for proto, src, sport, dst, dport in probes:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if proto == "udp" else socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.bind((str(src), int(sport)))
            if proto == "udp":
                s.connect((str(dst), int(dport)))
                s.send(b"probe")
            else:
                err = s.connect_ex((str(dst), int(dport)))
                if err not in (0, errno.EINPROGRESS):
                    raise OSError(err, "connect")
        except OSError as e:
            result.append("refused" if e.errno == errno.ECONNREFUSED else f"error: {e.strerror}")
            socks.append(None)
            s.close()
            continue
        result.append("timeout")
        socks.append(s)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        live = [s for s in socks if s is not None]
        if not live:
            break
        r, w, _ = select.select(live, [s for s in live if s.type == socket.SOCK_STREAM], [], 0.05)
        for s in set(r) | set(w):
            i = socks.index(s)
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH):
                result[i] = "refused"
            elif err == 0 and s.type == socket.SOCK_STREAM:
                result[i] = "sent"
            elif err == 0:
                try:
                    s.recv(2048)
                    result[i] = "sent"
                except OSError as e:
                    result[i] = "refused" if e.errno == errno.ECONNREFUSED else "timeout"
            else:
                result[i] = f"error: {errno.errorcode.get(err, err)}"
            s.close()
            socks[i] = None
    for left in socks:
        if left is not None:
            left.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "sniff":
        sniff(sys.argv[2])
    elif cmd == "listen":
        listen(sys.argv[2], sys.argv[3:])
    else:
        send(json.loads(sys.argv[2]))

"""A real BIND 9 (`named`) in a pod's namespace: authoritative for one test zone, nothing else.

The lab's DNS server is the seed's: BIND in a container. Here it is `named -g` (foreground,
logging to stderr) with a configuration generated into a temporary directory that also holds the
zone file, the pid file and the session key, so nothing of the host's /etc/bind or /var/cache/bind
is used. It listens on the pod's IP only, recursion is off and it sends no NOTIFYs, so it answers
for its zone and never asks anyone else: no packet leaves the lab.

    with BindServer.start(pod.ns, pod.ip) as server:   # returns once it answers
        ...
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kubeproxy.lab import netns as L

ZONE = "lab.test."
# The name the load generator and the health check ask for (kubeproxy.lab.dns.command_group.DEFAULT_NAME).
ANSWER_NAME = "www.lab.test."
ANSWER_IP = "192.0.2.53"
DNS_PORT = 53


class BindError(RuntimeError):
    """named could not be started or did not answer; the message carries its log's tail."""


def zone_text(zone: str = ZONE, answer_ip: str = ANSWER_IP) -> str:
    """A small authoritative zone: SOA, NS, and the `www` A record the lab's queries ask for."""
    return "\n".join(
        [
            "$TTL 300",
            f"{zone} IN SOA ns1.{zone} hostmaster.{zone} 1 3600 600 86400 300",
            f"{zone} IN NS ns1.{zone}",
            f"ns1.{zone} IN A {answer_ip}",
            f"www.{zone} IN A {answer_ip}",
            "",
        ]
    )


def named_conf(workdir: Path, listen_ip: str, *, port: int = DNS_PORT, zone: str = ZONE) -> str:
    """named.conf for an authoritative-only server whose every file lives in `workdir`."""
    return f"""\
options {{
    directory "{workdir}";
    pid-file "{workdir}/named.pid";
    session-keyfile "{workdir}/session.key";
    managed-keys-directory "{workdir}";
    listen-on port {port} {{ {listen_ip}; }};
    listen-on-v6 {{ none; }};
    recursion no;
    allow-query {{ any; }};
    dnssec-validation no;
    notify no;
    empty-zones-enable no;
    minimal-responses yes;
    querylog no;
}};
controls {{ }};
zone "{zone.rstrip(".")}" {{
    type primary;
    file "{workdir}/zone.db";
}};
"""


@dataclass
class BindServer:
    """One running `named`, its files and its log."""

    ns: L.NetNS
    ip: str
    port: int
    workdir: Path
    process: subprocess.Popen[str]

    @classmethod
    @contextmanager
    def start(cls, ns: L.NetNS, ip: str, *, port: int = DNS_PORT, timeout: float = 20) -> Iterator[BindServer]:
        """Start named in `ns` listening on `ip:port`; yields once it answers, stops it afterwards."""
        named = shutil.which("named")
        if named is None:
            raise BindError("named is not installed (Debian package bind9; scripts/setup installs it)")
        workdir = Path(tempfile.mkdtemp(prefix="kp-named-"))
        server: BindServer | None = None
        try:
            (workdir / "zone.db").write_text(zone_text())
            conf = workdir / "named.conf"
            conf.write_text(named_conf(workdir, ip, port=port))
            log = (workdir / "named.log").open("w")
            try:
                # -g: foreground, log to stderr; -4: IPv4 only; no -u: stay root, the namespace is ours.
                process = ns.popen([named, "-g", "-4", "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
            finally:
                log.close()
            server = cls(ns, ip, port, workdir, process)
            server.wait_answering(timeout)
            yield server
        finally:
            if server is not None:
                server.stop()
            shutil.rmtree(workdir, ignore_errors=True)

    def log(self) -> str:
        path = self.workdir / "named.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _tail(self, lines: int = 15) -> str:
        return "\n".join(self.log().splitlines()[-lines:]) or "(empty)"

    def answers(self) -> bool:
        """One `dig` from the server's own namespace: does it answer for the test name?"""
        proc = self.ns.run(
            ["dig", f"@{self.ip}", "-p", str(self.port), "+short", "+time=1", "+tries=1", ANSWER_NAME, "A"],
            check=False,
            timeout=10,
        )
        return proc.returncode == 0 and ANSWER_IP in proc.stdout.split()

    def wait_answering(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise BindError(f"named in {self.ns.name} exited with status {self.process.returncode}:\n{self._tail()}")
            if self.answers():
                return
            if time.monotonic() >= deadline:
                where = f"{self.ip}:{self.port}"
                raise BindError(f"named in {self.ns.name} did not answer on {where} in {timeout:g} s:\n{self._tail()}")
            time.sleep(0.1)

    def stop(self, timeout: float = 5) -> None:
        L.stop_process(self.process, timeout)

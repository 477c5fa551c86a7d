"""A pod's TCP server inside the VM: answers every line with the pod's name; prints 'ready' once listening."""

from __future__ import annotations

import socket
import sys
import threading


def serve(conn: socket.socket, name: str) -> None:
    with conn, conn.makefile("rw") as f:
        for _ in f:
            f.write(name + "\n")
            f.flush()


def main() -> None:
    name, ip, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((ip, port))
    srv.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn, name), daemon=True).start()


if __name__ == "__main__":
    main()

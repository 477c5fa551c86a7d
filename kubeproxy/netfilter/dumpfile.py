"""Reading a dump the user names (`--rules`, `--ipvs`, `--ipset-file`, `--conntrack`): any byte
sequence gives text or a DumpError that names the file, and for bytes that are not UTF-8 the line
and column, never a traceback.

Dumps are read whole (the parsers want text), up to `MAX_DUMP_BYTES`: a 10k-Service
iptables-save is ~50 MB. `-` is standard input; a FIFO (`<(iptables-save)`) reads like a file.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import BinaryIO

MAX_DUMP_BYTES = 1 << 30


class DumpError(ValueError):
    """A dump that cannot be read as text; the message starts with its name."""


def read_dump(path: str, max_bytes: int = MAX_DUMP_BYTES) -> str:
    """The text of `path` ("-": standard input); DumpError naming it if unreadable, too big or not UTF-8."""
    name = "standard input" if path == "-" else path
    try:
        if path == "-":
            data = _read_bounded(sys.stdin.buffer, max_bytes)
        else:
            with Path(path).open("rb") as f:
                data = _read_bounded(f, max_bytes)
    except OSError as exc:
        raise DumpError(f"{name}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise DumpError(f"{name}: bigger than {max_bytes:,} bytes, the limit for one dump")
    return decode_dump(data, name)


def decode_dump(data: bytes, name: str) -> str:
    """`data` as UTF-8; DumpError naming `name`, the line and the column of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise DumpError(f"{name}: line {line}, column {column}: not UTF-8 text (byte 0x{data[exc.start]:02x}: "
                        f"{exc.reason})") from None


def _read_bounded(f: BinaryIO, max_bytes: int) -> bytes:
    return f.read(max_bytes + 1)

"""What every backend shares: the error a failed sync raises.

A sync fails when a kernel tool refuses its input or cannot be run (`SyncError` and its
subclasses, one per tool); the live loop treats every such failure alike: the kernel keeps the
rules it had, the culprit Services are looked for and quarantined (proxy/quarantine.py), and the
next sync is a full one.
"""

from __future__ import annotations


class SyncError(RuntimeError):
    """A kernel tool refused a transaction or could not be run; the message carries its words."""

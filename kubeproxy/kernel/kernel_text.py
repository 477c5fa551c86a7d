"""The one place where strings that came from cluster objects are made safe for rule text.

`cluster/` validates names as the API server does, so a Service's namespace, name and port name
are DNS labels and IANA service names by the time they get here, and these functions leave them
unchanged (the iptables text stays byte-identical to upstream's). They are the second line: a
string that slipped past validation (a new source, a future field) must still never end a rule,
open a quote, add a rule of its own or push a comment past the kernel's length limit. Anything
outside the characters a valid name can hold becomes `_`.
"""

from __future__ import annotations

import re

# What a namespace/name:port string and an IP address can hold (IPv6 brackets and zones aside).
_UNSAFE = re.compile(r"[^A-Za-z0-9._/:\-]")
# nft identifiers (chain, set and map names) may hold letters, digits and `/ - _ .` only.
_UNSAFE_NFT_NAME = re.compile(r"[^A-Za-z0-9_./\-]")

# xt_comment keeps 256 bytes including the terminating NUL.
IPTABLES_COMMENT_MAX = 255
# nft refuses a comment of more than 128 bytes (NFTNL_UDATA_COMMENT_MAXLEN) with "comment too long".
NFT_COMMENT_MAX = 128


# The longest valid `namespace/name:port`: 63 + 1 + 63 + 1 + 15. Cut there, the longest comment
# upstream writes around it ("masquerade LOCAL traffic for ... external destinations") stays
# within xt_comment's 255 bytes.
WORD_MAX = 143


def word(text: str) -> str:
    """An object-derived word (`ns/name:port`) that may stand unquoted in iptables or nft text."""
    return _UNSAFE.sub("_", text[:WORD_MAX])


def iptables_comment(text: str) -> str:
    """A comment argument that iptables-restore reads back as exactly one word, within xt_comment's limit.

    Only the object-derived part needs `word`; this guards the whole (no quote, no newline) and
    the length, for callers that build comments from several pieces.
    """
    cleaned = "".join(c if c.isprintable() and c not in '"\\' else "_" for c in text)
    return cleaned.encode()[:IPTABLES_COMMENT_MAX].decode(errors="ignore")


def nft_quoted(text: str) -> str:
    """A double-quoted nft string (comments): no quote or newline inside, at most 128 bytes.

    nft's scanner has no escapes inside quotes, so a quote is replaced, not escaped; long
    comments (a 63-character namespace and name and a 15-character port) are cut, not refused.
    """
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        # A valid name's comment (every one at 10k Services) skips the walk by character.
        return '"' + text[:NFT_COMMENT_MAX] + '"'
    cleaned = "".join(c if c.isprintable() and c.isascii() and c not in '"\\' else "_" for c in text)
    return '"' + cleaned[:NFT_COMMENT_MAX] + '"'


def nft_name(text: str) -> str:
    """A chain, set or map name nft accepts unquoted."""
    return _UNSAFE_NFT_NAME.sub("_", text)

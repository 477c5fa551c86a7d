"""The token-file auth as client-go's (kubeproxy/sources/token_file.py): the token kept for a
minute, read again after a 401, the 401 handed back rather than re-sent, the last token kept
while the file cannot be read."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx2
import pytest

from kubeproxy.sources.connection import connect, load_config
from kubeproxy.sources.token_file import TokenFileAuth


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def serve(valid: set[str], seen: list[str]) -> httpx2.MockTransport:
    def handler(request: httpx2.Request) -> httpx2.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        seen.append(token)
        return httpx2.Response(200 if token in valid else 401, json={})

    return httpx2.MockTransport(handler)


def test_token_read_again_after_a_minute_or_a_401_and_the_401_not_resent(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("old\n")
    clock = Clock()
    valid = {"old"}
    seen: list[str] = []

    async def main() -> None:
        auth = TokenFileAuth(path, clock=clock)
        async with httpx2.AsyncClient(transport=serve(valid, seen), auth=auth, base_url="https://api") as client:
            assert (await client.get("/a")).status_code == 200
            path.write_text("new")
            clock.now = 59.0
            assert (await client.get("/a")).status_code == 200  # within the minute: the cached token
            valid.discard("old")
            assert (await client.get("/a")).status_code == 401  # handed back, once
            valid.add("new")
            assert (await client.get("/a")).status_code == 200  # read again after the 401
            path.write_text("newer")
            valid.add("newer")
            clock.now = 59.0 + 60.0
            assert (await client.get("/a")).status_code == 200  # a minute later: read again

    asyncio.run(main())
    assert seen == ["old", "old", "old", "new", "newer"]


def test_unreadable_file_keeps_the_last_token_and_names_the_file_without_one(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("t1")
    clock = Clock()
    auth = TokenFileAuth(path, clock=clock)
    assert auth.bearer() == "t1"
    path.unlink()
    clock.now = 120.0
    assert auth.bearer() == "t1"
    with pytest.raises(OSError, match="token"):
        TokenFileAuth(path).bearer()


def test_kubeconfig_token_file_gets_this_auth(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("t")
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        f"users: [{{name: c, user: {{tokenFile: '{tmp_path / 'token'}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: c}}]\n"
    )
    client = connect(load_config(config))
    try:
        assert isinstance(client.auth, TokenFileAuth)
    finally:
        asyncio.run(client.aclose())

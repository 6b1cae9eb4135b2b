"""The loopback endpoint verifiers harnesses call (`posttrain.envs.vf_env.bridge`): bad requests get
a 4xx and the endpoint stays up. Needs no verifiers install (default suite)."""

from __future__ import annotations

import socket

import httpx

from posttrain.envs.vf_env import MAX_REQUEST_BYTES, bridge

ROUTE = "/ep/{}/v1/chat/completions"


def raw_post(url: str, path: str, headers: str, body: bytes = b"") -> int:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode() + body)
        return int(s.recv(200).split()[1])


def test_bad_requests_get_4xx_and_the_endpoint_stays_up():
    url = bridge().url
    assert bridge().url.startswith("http://127.0.0.1:")  # loopback only: no key needed
    with httpx.Client(base_url=url, timeout=10) as c:
        assert c.post(ROUTE.format("nope"), content=b"{not json").status_code == 400
        assert c.post(ROUTE.format("nope"), content=b"[1, 2]").status_code == 400
        assert c.post(ROUTE.format("nope"), json={"messages": []}).status_code == 404  # no such episode
        assert c.post("/elsewhere", json={}).status_code == 404
    assert raw_post(url, ROUTE.format("nope"), f"Content-Length: {MAX_REQUEST_BYTES + 1}\r\n") == 413
    assert raw_post(url, ROUTE.format("nope"), "Content-Length: -5\r\n") == 400
    with httpx.Client(base_url=url, timeout=10) as c:  # still answering
        assert c.post(ROUTE.format("nope"), json={}).status_code == 404

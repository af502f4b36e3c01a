"""``HubReader.blocks``: the hub's blocks answers are read whole however they are chunked, cut
past the size bound, and every failure becomes a note naming the member, never an error. Runs
against a real local aiohttp server playing the hub's endpoint."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from kubernetes_asyncio import client

from gpufed.api.kubeconfig import KubeSource
from gpufed.console import reader as reader_mod
from gpufed.console.reader import HubReader


def big_answer(blocks: int) -> dict[str, Any]:
    return {
        "member": "big",
        "blocks": [
            {
                "domain": f"node:n{i:05d}",
                "product": "H100",
                "gpus": 8,
                "free": 8,
                "nodes": [f"n{i}"],
            }
            for i in range(blocks)
        ],
        "truncated": 0,
    }


async def serve_hub() -> TestServer:
    async def handler(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if request.headers.get("Authorization") != "Bearer tok":
            return web.json_response({"error": "no"}, status=401)
        if name == "denied":
            return web.json_response({"error": "no"}, status=403)
        if name == "down":
            return web.json_response({"error": "standby"}, status=503)
        resp = web.StreamResponse()  # chunked, as a proxy may send it
        await resp.prepare(request)
        body = json.dumps(big_answer(5000)).encode()
        for i in range(0, len(body), 10_000):
            await resp.write(body[i : i + 10_000])
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/fleet/members/{name}/blocks", handler)
    server = TestServer(app)
    await server.start_server()
    return server


def reader_for(url: str, token: str | None = "tok") -> HubReader:
    cfg = client.Configuration(host="https://hub.invalid")
    if token:
        cfg.api_key = {"BearerToken": f"Bearer {token}"}
    return HubReader(client.ApiClient(cfg), KubeSource(None, None, "default", "test"), hub_url=url)


async def test_a_big_chunked_answer_is_read_whole() -> None:
    server = await serve_hub()
    r = reader_for(str(server.make_url("")))
    try:
        got, notes = await r.blocks(["big", "denied", "down"])
    finally:
        await r.close()
        await server.close()
    assert len(got["big"]["blocks"]) == 5000
    assert set(got) == {"big"}
    text = " ".join(n.what for n in notes)
    assert "NVLink blocks of denied" in text
    assert "down (503)" in text


async def test_an_answer_past_the_bound_is_refused(monkeypatch: Any) -> None:
    monkeypatch.setattr(reader_mod, "MAX_BLOCKS_BYTES", 100_000)
    server = await serve_hub()
    r = reader_for(str(server.make_url("")))
    try:
        got, notes = await r.blocks(["big"])
    finally:
        await r.close()
        await server.close()
    assert got == {}
    assert "big (200)" in notes[0].what


async def test_without_a_bearer_token_only_a_note() -> None:
    r = reader_for("http://127.0.0.1:9", token=None)
    try:
        got, notes = await r.blocks(["a"])
    finally:
        await r.close()
    assert got == {}
    assert "no bearer token" in notes[0].what

"""The Web UI's codec endpoint turns gangflow's msgpack payloads into JSON for display."""

from __future__ import annotations

import base64
import json
import urllib.request

from engine.runtime.codec_server import CodecServer
from engine.types import pack


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_decode_turns_msgpack_into_json_and_leaves_the_rest():
    codec = CodecServer().start()
    try:
        ours = {"metadata": {"encoding": _b64(b"binary/plain")}, "data": _b64(pack({"rows": 3, "raw": b"\x00"}))}
        theirs = {"metadata": {"encoding": _b64(b"json/plain")}, "data": _b64(b'"text"')}
        request = urllib.request.Request(
            f"{codec.url}/decode?preserveStorageRefs=true",  # the query string the UI sends
            data=json.dumps({"payloads": [ours, theirs]}).encode(),
            headers={"Content-Type": "application/json", "Origin": "http://ui.example"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.headers["Access-Control-Allow-Origin"] == "http://ui.example"
            decoded = json.loads(response.read())["payloads"]
    finally:
        codec.stop()
    assert base64.b64decode(decoded[0]["metadata"]["encoding"]) == b"json/plain"
    assert json.loads(base64.b64decode(decoded[0]["data"])) == {"rows": 3, "raw": {"bytes_base64": "AA=="}}
    assert decoded[1] == theirs

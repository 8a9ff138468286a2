"""The Web UI's codec endpoint turns gangflow's msgpack payloads into JSON for display."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

from engine.runtime.codec_server import MAX_BODY, CodecServer
from engine.types import pack


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_decode_turns_msgpack_into_json_and_leaves_the_rest():
    codec = CodecServer(origins=("http://ui.example",)).start()
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


def _post(codec: CodecServer, body: bytes, **headers: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{codec.url}/decode", data=body, headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_other_origins_and_oversized_bodies_are_refused():
    codec = CodecServer().start()  # no origins given: pages served from this machine only
    try:
        body = json.dumps({"payloads": []}).encode()
        assert _post(codec, body, Origin="http://127.0.0.1:8233")[0] == 200  # the dev stack's Web UI
        assert _post(codec, body, Origin="https://evil.example")[0] == 403
        # refused from its Content-Length, before a byte of it is read
        status, answer = _post(codec, b"{}", **{"Content-Length": str(MAX_BODY + 1)})
        assert status == 413 and "body over" in answer["error"]
        assert _post(codec, b"{not json")[0] == 400
    finally:
        codec.stop()


def test_sealed_payloads_open_only_for_a_token_covering_the_namespace(tmp_path):
    import asyncio

    from temporalio.api.common.v1 import Payload

    from engine.runtime.encryption import EncryptionCodec
    from engine.runtime.tokens import DevKeys

    keys = {"k1": b"\x01" * 32}
    inner = Payload(metadata={"encoding": b"binary/plain"}, data=pack({"secret": "kangaroo"}))
    (sealed,) = asyncio.run(EncryptionCodec(keys).encode([inner]))
    wire = {
        "metadata": {k: _b64(v) for k, v in sealed.metadata.items()},
        "data": _b64(sealed.data),
    }
    body = json.dumps({"payloads": [wire]}).encode()
    dev = DevKeys.load_or_create(tmp_path)
    team_a, team_b = dev.tenant_token("team-a", "read"), dev.tenant_token("team-b")
    locked = CodecServer(keys=keys).start()  # keys but no JWKS: nothing sealed is opened for anyone
    opener = CodecServer(keys=keys, jwks=str(dev.jwks_file)).start()
    try:
        status, answer = _post(locked, body, Authorization=f"Bearer {team_a}", **{"X-Namespace": "gf-team-a"})
        assert status == 200 and answer["payloads"] == [wire]
        for token, namespace in ((team_b, "gf-team-a"), (None, "gf-team-a"), ("garbage", "gf-team-a")):
            headers = {"X-Namespace": namespace, **({"Authorization": f"Bearer {token}"} if token else {})}
            assert _post(opener, body, **headers)[1]["payloads"] == [wire]  # still sealed
        status, answer = _post(opener, body, Authorization=f"Bearer {team_a}", **{"X-Namespace": "gf-team-a"})
        (opened,) = answer["payloads"]
        assert json.loads(base64.b64decode(opened["data"])) == {"secret": "kangaroo"}
    finally:
        locked.stop()
        opener.stop()

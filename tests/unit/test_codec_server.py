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
    codec = CodecServer(origins=("http://127.0.0.1:8233",)).start()  # the Web UI's origin only
    unset = CodecServer().start()  # no origin given: no browser page at all
    try:
        body = json.dumps({"payloads": []}).encode()
        assert _post(codec, body, Origin="http://127.0.0.1:8233")[0] == 200  # the dev stack's Web UI
        # another site, and another page on this machine (any local web server a tenant runs)
        for origin in ("https://evil.example", "http://127.0.0.1:9999", "http://localhost:8233"):
            assert _post(codec, body, Origin=origin)[0] == 403, origin
        assert _post(unset, body, Origin="http://127.0.0.1:8233")[0] == 403
        assert _post(unset, body)[0] == 200  # not a browser: the listening address is the boundary
        # refused from its Content-Length, before a byte of it is read
        status, answer = _post(codec, b"{}", **{"Content-Length": str(MAX_BODY + 1)})
        assert status == 413 and "body over" in answer["error"]
        assert _post(codec, b"{not json")[0] == 400
    finally:
        codec.stop()
        unset.stop()


def test_sealed_payloads_open_only_for_a_token_covering_the_namespace(tmp_path):
    import asyncio

    from temporalio.api.common.v1 import Payload

    from engine.runtime.encryption import EncryptionCodec
    from engine.runtime.tokens import DevKeys

    keys = {"gf-team-a": b"\x01" * 32, "gf-team-b.v2": b"\x02" * 32, "k1": b"\x03" * 32}
    inner = Payload(metadata={"encoding": b"binary/plain"}, data=pack({"secret": "kangaroo"}))

    def sealed_with(key_id: str) -> dict[str, object]:
        (sealed,) = asyncio.run(EncryptionCodec({key_id: keys[key_id]}).encode([inner]))
        return {"metadata": {k: _b64(v) for k, v in sealed.metadata.items()}, "data": _b64(sealed.data)}

    wire, team_b_wire, loose_wire = sealed_with("gf-team-a"), sealed_with("gf-team-b.v2"), sealed_with("k1")
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
        # team-a's token, its own namespace named: team-b's payload (and one of a key of no namespace) stay sealed
        both = json.dumps({"payloads": [team_b_wire, loose_wire]}).encode()
        status, answer = _post(opener, both, Authorization=f"Bearer {team_a}", **{"X-Namespace": "gf-team-a"})
        assert status == 200 and answer["payloads"] == [team_b_wire, loose_wire]
        # team-b's token opens team-b's payload (a rotated key of its namespace)
        status, answer = _post(opener, both, Authorization=f"Bearer {team_b}", **{"X-Namespace": "gf-team-b"})
        assert json.loads(base64.b64decode(answer["payloads"][0]["data"])) == {"secret": "kangaroo"}
        assert answer["payloads"][1] == loose_wire
    finally:
        locked.stop()
        opener.stop()

"""A Temporal "remote codec" endpoint so the Web UI shows gangflow's payloads as JSON.

gangflow sends one msgpack blob per workflow start, task call and result (compact, and typed by the
task's signature). The Web UI cannot read msgpack, so it would show base64. Temporal's UI can call a
codec endpoint to decode payloads for display: this is one. ``gangflow dev`` starts it and points its UI
at it; on a cluster run ``gangflow codec-server`` and set the UI's codec endpoint to it.

Protocol (Temporal's): ``POST /decode`` (and ``/encode``) with ``{"payloads": [{"metadata": {k: b64},
"data": b64}]}``; the browser calls it directly, so CORS is answered. Only display changes: nothing is
re-encoded on the way back to the server.

With encryption at rest (``GANGFLOW_ENCRYPTION_KEYS``, engine.runtime.encryption) the payloads are sealed. This
server opens them only for a caller whose token (``Authorization: Bearer``, checked against the JWKS it is
given) covers the namespace the UI names in ``X-Namespace``, and then only with that namespace's own keys: a
key belongs to the namespace its id names (``gf-team-a``, or ``gf-team-a.<version>`` for a rotation), so a
payload sealed with team-b's key stays sealed for team-a's token whatever namespace the caller claims, and a
key whose id names no namespace opens nothing. Without a JWKS it opens nothing sealed. It answers browsers from
the origins it is told only (the Web UI's; none by default), refuses bodies over ``MAX_BODY`` bytes, and listens
on 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import msgpack
from temporalio.api.common.v1 import Payload

from engine.runtime.encryption import ENCODING, EncryptionCodec

__all__ = ["MAX_BODY", "CodecServer", "decode_payload", "key_namespace"]

#: the most a decode request may carry (the UI sends a page of payloads; Temporal's own limit is 2 MB each)
MAX_BODY = 4 << 20
_SEALED = base64.b64encode(ENCODING).decode()

_BINARY = base64.b64encode(b"binary/plain").decode()
_JSON = base64.b64encode(b"json/plain").decode()


def key_namespace(key_id: str) -> str:
    """The namespace an encryption key belongs to: its id up to the first ``.`` (``gf-team-a.v2``: gf-team-a)."""
    return key_id.split(".", 1)[0]


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes_base64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def decode_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A binary payload holding msgpack becomes a JSON payload; anything else is returned as is."""
    if payload.get("metadata", {}).get("encoding") != _BINARY:
        return payload
    try:
        value = msgpack.unpackb(base64.b64decode(payload.get("data", "")), raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError):
        return payload
    text = json.dumps(_jsonable(value), default=str).encode()
    return {"metadata": {"encoding": _JSON}, "data": base64.b64encode(text).decode()}


def _open(payload: dict[str, Any], codec: EncryptionCodec) -> dict[str, Any]:
    """A sealed payload opened (then shown as JSON when it is msgpack); a payload it cannot open is left sealed."""
    try:
        sealed = Payload(
            metadata={k: base64.b64decode(v) for k, v in payload.get("metadata", {}).items()},
            data=base64.b64decode(payload.get("data", "")),
        )
        (inner,) = asyncio.run(codec.decode([sealed]))
    except Exception:  # another key, or not a payload at all: shown as it came
        return payload
    opened = {
        "metadata": {k: base64.b64encode(v).decode() for k, v in inner.metadata.items()},
        "data": base64.b64encode(inner.data).decode(),
    }
    return decode_payload(opened)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _origin_allowed(self) -> bool:
        origin = self.headers.get("Origin")
        if origin is None:  # not a browser (curl, the temporal CLI): the listening address is the boundary
            return True
        # a page of any other origin (another site, another local server) gets nothing: only the Web UI's
        return origin.rstrip("/") in self.server.origins

    def _cors(self) -> None:
        origin = self.headers.get("Origin")
        if origin is None or not self._origin_allowed():
            return  # no CORS answer at all: a browser keeps the response from the page
        self.send_header("Access-Control-Allow-Origin", origin)
        self.send_header("Vary", "Origin")
        self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "Content-Type, X-Namespace, Authorization")
        self.send_header("Access-Control-Allow-Credentials", "true")

    def _refuse(self, code: int, why: str) -> None:
        body = json.dumps({"error": why}).encode()
        self.send_response(code)
        self._cors()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_OPTIONS(self) -> None:
        if not self._origin_allowed():
            self._refuse(403, "origin not allowed")
            return
        self.send_response(200)
        self._cors()
        self.end_headers()

    def _opener(self) -> EncryptionCodec | None:
        """The keys of the namespace asked about, if the caller's token covers it (sealed payloads stay sealed
        else): X-Namespace picks among the namespaces the token covers, never beyond them."""
        verifier = self.server.verifier
        namespace = self.headers.get("X-Namespace") or "default"
        codec = self.server.codecs.get(namespace)
        if codec is None or verifier is None:
            return None
        try:
            claims = verifier.claims(self.headers.get("Authorization"))
        except Exception:
            return None
        # reading a payload is a read: a worker-only role (bit 1) does not cover it (engine.runtime.tokens.ROLES)
        return codec if claims.role_in(namespace) & ~1 else None

    def do_POST(self) -> None:
        if not self._origin_allowed():
            self._refuse(403, "origin not allowed")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self._refuse(413, f"body over {MAX_BODY} bytes")
            return
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
            payloads = list(body.get("payloads", []))
        except (ValueError, AttributeError, TypeError):
            self._refuse(400, 'expected {"payloads": [...]}')
            return
        if urlsplit(self.path).path.rstrip("/").endswith("/decode"):  # the UI adds a query string
            codec = self._opener()
            payloads = [
                _open(p, codec) if codec is not None and _is_sealed(p) else decode_payload(p)
                for p in payloads
                if isinstance(p, dict)
            ]
        answer = json.dumps({"payloads": payloads}).encode()
        self.send_response(200)
        self._cors()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the UI calls it for every payload
        return


def _is_sealed(payload: dict[str, Any]) -> bool:
    return bool(payload.get("metadata", {}).get("encoding") == _SEALED)


class _Server(ThreadingHTTPServer):
    origins: frozenset[str]
    codecs: dict[str, EncryptionCodec]  # by namespace
    verifier: Any  # engine.runtime.tokens.TokenVerifier: imported only when a JWKS is given


class CodecServer:
    """The codec endpoint in a daemon thread of this process."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        origins: tuple[str, ...] = (),
        keys: dict[str, bytes] | None = None,
        jwks: str | None = None,
    ) -> None:
        """``origins``: the browser origins to answer (the Web UI's; none by default); ``keys``: the encryption
        keys to open sealed payloads with, each for its own namespace (:func:`key_namespace`), for callers whose
        token the ``jwks`` file verifies."""
        verifier = None
        if jwks is not None:
            from engine.runtime.tokens import TokenVerifier

            verifier = TokenVerifier.from_file(jwks)
        self.httpd = _Server((host, port), _Handler)
        self.httpd.origins = frozenset(o.rstrip("/") for o in origins)
        by_namespace: dict[str, dict[str, bytes]] = {}
        for key_id, key in (keys or {}).items():
            by_namespace.setdefault(key_namespace(key_id), {})[key_id] = key
        self.httpd.codecs = {namespace: EncryptionCodec(own) for namespace, own in by_namespace.items()}
        self.httpd.verifier = verifier
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        # the bound address (port 0 became a real one); server_address is typed to allow bytes, never given here
        host, port = self.httpd.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def start(self) -> CodecServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

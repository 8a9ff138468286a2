"""A Temporal "remote codec" endpoint so the Web UI shows gangflow's payloads as JSON.

gangflow sends one msgpack blob per workflow start, task call and result (compact, and typed by the
task's signature). The Web UI cannot read msgpack, so it would show base64. Temporal's UI can call a
codec endpoint to decode payloads for display: this is one. ``gangflow dev`` starts it and points its UI
at it; on a cluster run ``gangflow codec-server`` and set the UI's codec endpoint to it.

Protocol (Temporal's): ``POST /decode`` (and ``/encode``) with ``{"payloads": [{"metadata": {k: b64},
"data": b64}]}``; the browser calls it directly, so CORS is answered. Only display changes: nothing is
re-encoded on the way back to the server.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import msgpack

__all__ = ["CodecServer", "decode_payload"]

_BINARY = base64.b64encode(b"binary/plain").decode()
_JSON = base64.b64encode(b"json/plain").decode()


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


class _Handler(BaseHTTPRequestHandler):
    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", self.headers.get("Origin") or "*")
        self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "Content-Type, X-Namespace, Authorization")
        self.send_header("Access-Control-Allow-Credentials", "true")

    def do_OPTIONS(self) -> None:
        self.send_response(200)
        self._cors()
        self.end_headers()

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        payloads = body.get("payloads", [])
        if urlsplit(self.path).path.rstrip("/").endswith("/decode"):  # the UI adds a query string
            payloads = [decode_payload(p) for p in payloads]
        answer = json.dumps({"payloads": payloads}).encode()
        self.send_response(200)
        self._cors()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the UI calls it for every payload
        return


class CodecServer:
    """The codec endpoint in a daemon thread of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
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

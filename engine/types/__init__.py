"""Types that cross task boundaries: validation, wire encoding, File / Directory references (pure)."""

from engine.types.codec import MAX_PAYLOAD_BYTES, ValueCodec, check_payload_size, pack, type_name, unpack
from engine.types.data import DataRef
from engine.types.files import Artifact, Directory, File
from engine.types.schema import Schema

__all__ = [
    "MAX_PAYLOAD_BYTES",
    "Artifact",
    "DataRef",
    "Directory",
    "File",
    "Schema",
    "ValueCodec",
    "check_payload_size",
    "pack",
    "type_name",
    "unpack",
]

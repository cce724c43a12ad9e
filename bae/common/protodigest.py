"""Digest of the .proto sources, shared by the generator and the loader."""

from __future__ import annotations

import hashlib
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[2] / "protos"


def proto_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(PROTO_ROOT.rglob("*.proto")):
        digest.update(path.relative_to(PROTO_ROOT).as_posix().encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()

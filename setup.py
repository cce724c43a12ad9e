"""Build hook: the gRPC code in bae/proto/ is generated from protos/ when missing or stale.

It runs before setuptools collects the packages, so bae.proto is packaged (and
mapped by an editable install) like any other. Everything else is declared in
pyproject.toml. A source tree without protos/ packages the bae/proto/ it ships with.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent


def protos_fresh() -> bool:
    sys.path.insert(0, str(ROOT))
    from bae.common.protodigest import proto_digest

    generated = ROOT / "bae" / "proto" / "__init__.py"
    return generated.is_file() and f'SOURCE_DIGEST = "{proto_digest()}"' in generated.read_text()


if (ROOT / "protos").is_dir() and not protos_fresh():
    subprocess.run([sys.executable, str(ROOT / "tools" / "genproto.py")], check=True)
setup()

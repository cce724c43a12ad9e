"""Build hook: the gRPC code in baeproto/ is generated from protos/ when missing or stale.

Everything else is declared in pyproject.toml. A source tree without protos/
(an sdist built elsewhere) packages the baeproto/ it ships with.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def protos_fresh() -> bool:
    sys.path.insert(0, str(ROOT))
    from bae.protodigest import proto_digest

    generated = ROOT / "baeproto" / "__init__.py"
    return generated.is_file() and f'SOURCE_DIGEST = "{proto_digest()}"' in generated.read_text()


class BuildWithProtos(build_py):
    def run(self) -> None:
        if (ROOT / "protos").is_dir() and not protos_fresh():
            subprocess.run([sys.executable, str(ROOT / "tools" / "genproto.py")], check=True)
        # The package list was computed before the code existed.
        self.packages = sorted({*(self.packages or []), *find_packages(str(ROOT), include=["baeproto*"])})
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})

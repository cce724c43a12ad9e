"""What the tests and the benchmarks share: the scripted mock LLM, stacks of real service processes,
PostgreSQL and Docker for tests, the MCP test server, an OTLP receiver and JSON-RPC helpers.

Not shipped with the package: it runs from the repository root (pytest's `pythonpath`, or
`python -m` from there). Importing the package itself loads nothing but this constant: the
compose test mounts it into an image that has only the server's dependencies.
"""

import re
from pathlib import Path

# The repository.
ROOT = Path(__file__).resolve().parent.parent

# The store's migration revisions, oldest first ("0001", "0002", ...): what a new store
# applies. Each is its file's `revision = "..."`; the files' names sort in the order they apply.
REVISIONS = [
    re.search(r'^revision = "([^"]+)"$', path.read_text(encoding="utf-8"), re.MULTILINE).group(1)  # type: ignore[union-attr]
    for path in sorted((ROOT / "bae" / "services" / "session" / "store" / "migrations" / "versions").glob("[0-9]*_*.py"))
]

"""The guide parser (testkit/guides.py): which blocks of a guide run, in what order, and what it needs;
and every guide in docs/guides/ parses. The runner itself: tests/integration/test_guides.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit import ROOT, guides

pytestmark = pytest.mark.unit

GUIDE = """\
# A guide
<!-- guide: needs=docker -->

Start it:

```sh no-run
bae run --demo
```

```toml file=bae-config.toml
[limits]
burst = 5
```

```python
import os
print(os.environ["BAE_ADDR"])
```

The answer:

```text
127.0.0.1:8080
```

1. In a list:

   ```bash
   echo "  kept"
   ```

````python
print("```")
````
"""


def test_blocks_in_order_with_what_each_is() -> None:
    guide = guides.parse(GUIDE)
    assert [(block.language, block.kind, block.line) for block in guide.blocks] == [
        ("sh", "shown", 7), ("toml", "file", 11), ("python", "python", 16), ("text", "shown", 23),
        ("bash", "sh", 29), ("python", "python", 33),
    ]
    assert guide.blocks[2].code == 'import os\nprint(os.environ["BAE_ADDR"])\n'
    assert guide.blocks[4].code == 'echo "  kept"\n'  # the fence's indent is removed, no more
    assert guide.blocks[5].code == 'print("```")\n'  # a longer fence holds a shorter one
    assert [block.line for block in guide.steps] == [16, 29, 33]
    assert guide.files == {"bae-config.toml": "[limits]\nburst = 5\n"}
    assert guide.needs == {"docker"} and guide.stack == "demo"


def test_directives() -> None:
    guide = guides.parse("<!-- guide: needs=docker,postgres stack=none -->\n<!-- guide: needs=docker -->\n")
    assert guide.needs == {"docker", "postgres"} and guide.stack == "none"
    assert guides.parse("no directive\n").needs == frozenset()


@pytest.mark.parametrize("text, message", [
    ("```python\nprint(1)\n", "never closed"),
    ("<!-- guide: needs=kubernetes -->", "needs= takes docker, postgres"),
    ("<!-- guide: stack=compose -->", "stack= takes demo, none"),
    ("<!-- guide: run=always -->", "unknown guide directive"),
    ("```sh file=../outside.sh\n```\n", "must be a relative path"),
    ("```sh file=/etc/passwd\n```\n", "must be a relative path"),
    ("```toml file=a.toml\n```\n```toml file=a.toml\n```\n", "written twice"),
])
def test_a_guide_that_cannot_run_as_written_is_refused(text: str, message: str) -> None:
    with pytest.raises(guides.GuideError, match=message):
        guides.parse(text)


def test_a_line_starting_with_an_inline_code_span_is_no_fence() -> None:
    guide = guides.parse("```x``` is inline\n```sh\necho\n```\n")
    assert [block.code for block in guide.blocks] == ["echo\n"]


@pytest.mark.parametrize("path", sorted((ROOT / "docs" / "guides").glob("*.md")), ids=lambda path: path.stem)
def test_every_guide_parses(path: Path) -> None:
    guides.read(path)


def test_every_guide_is_in_the_index() -> None:
    guides_dir = ROOT / "docs" / "guides"
    index = (guides_dir / "README.md").read_text()
    assert {path.name for path in guides_dir.glob("*.md") if f"]({path.name})" not in index} == {"README.md"}
    assert {name for name in re.findall(r"\]\(([^)/#]+\.md)\)", index) if not (guides_dir / name).is_file()} == set()

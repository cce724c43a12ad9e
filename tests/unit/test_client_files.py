"""bae_client's built-in file tools: confined to their directories through symlinks and `..`, refusals as
results the model reads, bounded reads, writes and listings."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from bae_client import FileToolConfig, explore_files_tool, read_file_tool, write_file_tool

pytestmark = pytest.mark.unit


def call(tool, **input):  # type: ignore[no-untyped-def]
    return json.loads(tool.handler(input))


@pytest.fixture
def area(tmp_path: Path) -> Path:
    root = tmp_path / "area"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("alpha")
    (root / "docs" / "b.txt").write_text("beta")
    (root / ".env").write_text("SECRET=1")
    (tmp_path / "outside.md").write_text("not yours")
    os.symlink(tmp_path / "outside.md", root / "docs" / "escape.md")
    os.symlink(tmp_path, root / "up")
    os.symlink(root, root / "docs" / "loop")
    return root


def test_reads_stay_inside_the_allowed_directories(area: Path) -> None:
    read = read_file_tool(FileToolConfig([str(area)], denied_extensions=["env"]))
    assert call(read, path=str(area / "docs" / "a.md")) == {"path": str(area / "docs" / "a.md"), "content": "alpha"}
    for path in (area / "docs" / "escape.md", area / "docs" / ".." / ".." / "outside.md", area / "up" / "outside.md"):
        assert call(read, path=str(path))["error"].endswith("is not under any allowed directory"), path
    assert call(read, path=str(area / ".env")) == {"error": "path not permitted: extension .env is denied"}
    assert call(read, path=str(area / "docs" / "none.md"))["error"].startswith("read failed: ")
    assert call(read) == {"error": "read_file requires a string `path`"}
    assert call(read_file_tool(FileToolConfig([])), path=str(area / "docs" / "a.md"))["error"].startswith(
        "path not permitted")
    small = read_file_tool(FileToolConfig([str(area)], max_bytes=3))
    assert call(small, path=str(area / "docs" / "a.md")) == {
        "error": "read failed: the file is larger than 3 bytes"}


def test_writes_need_an_existing_directory_unless_allowed(area: Path) -> None:
    config = FileToolConfig([str(area)], allowed_extensions=["md"], allow_regex=re.compile(r"^[a-z]+\.md$"))
    write = write_file_tool(config)
    target = area / "docs" / "new.md"
    assert call(write, path=str(target), content="héllo") == {"path": str(target), "bytes_written": 6}
    assert target.read_text() == "héllo"
    assert call(write, path=str(area / "docs" / "x.txt"), content="")["error"].endswith("not in the allowed set")
    assert call(write, path=str(area / "docs" / "Bad.md"), content="")["error"].endswith("the allow pattern")
    deep = area / "new" / "dir" / "c.md"
    assert "parent directory does not exist" in call(write, path=str(deep), content="x")["error"]
    make = write_file_tool(FileToolConfig([str(area)], create_parents=True, max_bytes=4))
    assert call(make, path=str(deep), content="x")["bytes_written"] == 1
    assert call(make, path=str(deep), content="12345") == {"error": "write failed: more than 4 bytes"}
    assert call(make, path=str(area / "up" / "outside.md"), content="x")["error"].startswith("path not permitted")
    assert (area.parent / "outside.md").read_text() == "not yours"


def test_listings_show_only_what_may_be_read_and_end(area: Path) -> None:
    explore = explore_files_tool(FileToolConfig([str(area)], denied_extensions=["env"]))
    assert call(explore, path=str(area)) == [{"path": "docs", "is_dir": True, "size_bytes": 0}]
    listed = call(explore, path=str(area), recursive=True)
    assert [entry["path"] for entry in listed] == ["docs", "docs/a.md", "docs/b.txt"]
    assert call(explore, path=str(area / "docs" / "a.md")) == {"error": f"{str(area / 'docs' / 'a.md')!r} is "
                                                                        "not a directory"}
    bounded = explore_files_tool(FileToolConfig([str(area)], max_entries=2))
    assert len(call(bounded, path=str(area), recursive=True)) == 2

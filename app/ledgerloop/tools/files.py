"""Read tools confined to one directory: `read_file`, `list_dir` and `search_files`.

    file_tools(root)    -> (read_file, list_dir, search_files), bound to `root`

Every path the model supplies is joined to the root and resolved (symlinks included, the
way the operating system would follow them); a path that resolves outside the root is
refused with an error tool result that names the path and the root, so the model can
correct itself and a symlink or `..` planted in the directory leads nowhere. What a tool
returns is capped in bytes: a log of a gigabyte reaches the model as a page and an offset
to ask for the next one, and the journal keeps the page, not the log.

The check is made on every call, against the root as it resolved when the tools were made
(moving the root afterwards does not move the boundary). The file is opened with
O_NOFOLLOW, so a symlink swapped in after the check as the last component fails to open
instead of being followed.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ledgerloop.errors import ConfigError
from ledgerloop.tools.errors import NonRetryableToolError
from ledgerloop.tools.registry import Tool, ToolContext, read_tool

#: Bytes of one file a `read_file` call returns at most (ask again with `offset` for more).
DEFAULT_MAX_BYTES = 16_000
#: Entries one `list_dir` call returns at most.
MAX_ENTRIES = 200
#: Matching lines one `search_files` call returns at most, and the bytes it reads at most.
MAX_MATCHES = 50
MAX_SCAN_BYTES = 8_000_000


class PathOutsideRoot(NonRetryableToolError):
    """The path resolves outside the directory these tools are confined to."""


class ReadFileArgs(BaseModel):
    path: str = Field(min_length=1, max_length=1000, description="File path, relative to the root")
    offset: int = Field(default=0, ge=0, description="Byte offset to start reading at")


class ListDirArgs(BaseModel):
    path: str = Field(
        default=".", min_length=1, max_length=1000, description="Directory, relative to the root"
    )


class SearchArgs(BaseModel):
    text: str = Field(min_length=1, max_length=200, description="Text to look for (exact)")
    path: str = Field(
        default=".",
        min_length=1,
        max_length=1000,
        description="File or directory to search, relative to the root",
    )


class Confinement:
    """A root directory and the rule that keeps every resolved path inside it."""

    def __init__(self, root: str | Path, max_bytes: int) -> None:
        try:
            self.root = Path(root).resolve(strict=True)
        except OSError as exc:
            raise ConfigError(
                f"file tools root {root} does not exist ({exc.strerror})",
                fix="pass file_tools() an existing directory",
            ) from exc
        if not self.root.is_dir():
            raise ConfigError(f"file tools root {root} is not a directory", fix="pass a directory")
        if max_bytes < 1:
            raise ConfigError(f"max_bytes is {max_bytes}", fix="give a positive byte cap")
        self.max_bytes = max_bytes

    def resolve(self, supplied: str) -> Path:
        """The real path `supplied` names under the root; refused if it lands outside."""
        # An absolute path replaces the root when joined, and is then refused like any other
        # path outside it.
        joined = self.root / supplied
        try:
            real = joined.resolve(strict=True)
        except FileNotFoundError:
            # Resolve what exists, so a missing file under a symlinked directory that points
            # outside is still reported as outside (not as merely missing).
            real = joined.resolve(strict=False)
            if not real.is_relative_to(self.root):
                raise self._outside(supplied) from None
            raise NonRetryableToolError(
                f"no such file or directory: {supplied!r} (paths are relative to the root)"
            ) from None
        except (OSError, RuntimeError) as exc:  # a symlink loop, a name too long
            raise NonRetryableToolError(f"cannot resolve {supplied!r}: {exc}") from None
        if not real.is_relative_to(self.root):
            raise self._outside(supplied)
        return real

    def _outside(self, supplied: str) -> PathOutsideRoot:
        return PathOutsideRoot(
            f"path {supplied!r} resolves outside the root {self.root}; "
            "only files under the root can be read: use a path relative to it"
        )

    def relative(self, real: Path) -> str:
        return real.relative_to(self.root).as_posix() or "."


def _read_page(confined: Confinement, args: ReadFileArgs) -> dict[str, Any]:
    real = confined.resolve(args.path)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise NonRetryableToolError(f"cannot open {args.path!r}: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        what = "a directory: use list_dir" if stat.S_ISDIR(info.st_mode) else "not a file"
        raise NonRetryableToolError(f"{args.path!r} is {what}")
    with os.fdopen(fd, "rb") as handle:
        handle.seek(args.offset)
        data = handle.read(confined.max_bytes)
    end = args.offset + len(data)
    page: dict[str, Any] = {
        "path": confined.relative(real),
        "size": info.st_size,
        "offset": args.offset,
        "content": data.decode("utf-8", errors="replace"),
    }
    if end < info.st_size:
        page["next_offset"] = end
        page["note"] = f"truncated at {confined.max_bytes} bytes; read on with offset={end}"
    return page


def _list(confined: Confinement, args: ListDirArgs) -> dict[str, Any]:
    real = confined.resolve(args.path)
    if not real.is_dir():
        raise NonRetryableToolError(f"{args.path!r} is not a directory: use read_file")
    entries = []
    for child in sorted(real.iterdir(), key=lambda p: p.name):
        # lstat: a symlink is listed as a link, never followed to describe its target.
        info = child.lstat()
        kind = (
            "link"
            if stat.S_ISLNK(info.st_mode)
            else "dir"
            if stat.S_ISDIR(info.st_mode)
            else "file"
        )
        entry: dict[str, Any] = {"name": child.name, "type": kind}
        if kind == "file":
            entry["size"] = info.st_size
        entries.append(entry)
    listing: dict[str, Any] = {"path": confined.relative(real), "entries": entries[:MAX_ENTRIES]}
    if len(entries) > MAX_ENTRIES:
        listing["note"] = f"{len(entries) - MAX_ENTRIES} more entries not shown"
    return listing


def _search(confined: Confinement, args: SearchArgs) -> dict[str, Any]:
    real = confined.resolve(args.path)
    files = [real] if real.is_file() else sorted(p for p in real.rglob("*") if p.is_file())
    matches: list[dict[str, Any]] = []
    scanned = 0
    needle = args.text.lower()
    for candidate in files:
        # Each file found by walking is checked too: a symlink inside the tree may point out.
        target = candidate.resolve()
        if not target.is_relative_to(confined.root) or not target.is_file():
            continue
        scanned += target.stat().st_size
        if scanned > MAX_SCAN_BYTES:
            break
        with open(target, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                line = raw.decode("utf-8", errors="replace").rstrip("\n")
                if needle in line.lower():
                    matches.append(
                        {
                            # Walked from a resolved directory: lexically under the root.
                            "path": candidate.relative_to(confined.root).as_posix(),
                            "line": number,
                            "text": line[:300],
                        }
                    )
                    if len(matches) >= MAX_MATCHES:
                        break
        if len(matches) >= MAX_MATCHES:
            break
    found: dict[str, Any] = {"text": args.text, "matches": matches}
    if len(matches) >= MAX_MATCHES or scanned > MAX_SCAN_BYTES:
        found["note"] = "stopped early: narrow the path or the text"
    return found


def file_tools(
    root: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES, prefix: str = ""
) -> tuple[Tool, ...]:
    """`read_file`, `list_dir` and `search_files`, confined to `root` (names prefixed by
    `prefix`, for an agent that reads two roots)."""
    confined = Confinement(root, max_bytes)

    @read_tool(
        f"{prefix}read_file",
        f"Read a file under the root (at most {max_bytes} bytes per call; use offset for more).",
        ReadFileArgs,
    )
    async def read_file(args: ReadFileArgs, ctx: ToolContext) -> dict[str, Any]:
        return await asyncio.to_thread(_read_page, confined, args)

    @read_tool(f"{prefix}list_dir", "List a directory under the root.", ListDirArgs)
    async def list_dir(args: ListDirArgs, ctx: ToolContext) -> dict[str, Any]:
        return await asyncio.to_thread(_list, confined, args)

    @read_tool(
        f"{prefix}search_files",
        "Find lines containing a text (case-insensitive) in the files under a path.",
        SearchArgs,
    )
    async def search_files(args: SearchArgs, ctx: ToolContext) -> dict[str, Any]:
        return await asyncio.to_thread(_search, confined, args)

    return (read_file, list_dir, search_files)

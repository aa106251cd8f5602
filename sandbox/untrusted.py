"""The one doorway through which the host reads what a launch left.

Everything in a launch directory is the candidate's: a file there may have been replaced by a link to a
host secret, a FIFO that blocks whoever opens it, a device that never ends, a folder, or a file larger
than the disk. So the host reads a launch only through `LaunchFiles`:

- a path is opened one component at a time from the launch directory's own descriptor, each with
  `O_NOFOLLOW`: a link anywhere on the way is refused, never followed, and nothing outside the launch
  directory can be named (no absolute path, no `..`);
- the last component is looked at first (`lstat`) and opened only when it is a regular file, with
  `O_NONBLOCK` (a FIFO swapped in between the look and the open cannot block) and checked again on
  its descriptor (`fstat`, the same inode);
- a file is read up to its caller's cap, and the whole launch up to the reader's byte budget; a
  folder is listed from its descriptor, entries typed without following links, their number capped.

Whatever is refused is one sentence naming the file ("rank0.log was replaced by a symbolic link"),
kept in `refusals`: the caller fails the launch with it. Nothing refused is ever read, so it can
neither hang the host nor bring a host file back. A file that is simply absent is no refusal (a
launch that crashed writes little). Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import (
    Any,
    BinaryIO,
    NotRequired,
    Required,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

DEFAULT_BUDGET = 1 << 30  # bytes the host reads from one launch at most, all files together
MAX_ENTRIES = 4096  # entries of one folder the host looks at
MAX_NAME = 255

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def kind_of(mode: int) -> str:
    """A file type in words, as a refusal names it."""
    if stat.S_ISREG(mode):
        return "a file"
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "something that is not a file"


@dataclass(frozen=True)
class Entry:
    """One entry of a launch folder, typed without following it: `kind` is kind_of's words."""

    name: str
    kind: str
    size: int

    @property
    def is_file(self) -> bool:
        return self.kind == "a file"

    @property
    def is_folder(self) -> bool:
        return self.kind == "a folder"


class Refused(Exception):
    """A launch file the host will not read; the message is one sentence naming it."""


@dataclass
class LaunchFiles:
    """Reads one launch directory without trusting it (module docstring). `budget`: bytes it reads at
    most over all files; `refusals`: a sentence for each thing it refused, in order."""

    root: Path
    budget: int = DEFAULT_BUDGET
    refusals: list[str] = field(default_factory=list)
    read_bytes_total: int = 0

    # ------------------------------------------------------------------ the public reads

    def exists(self, rel: str) -> bool:
        """Whether `rel` names something in the launch, of any kind (nothing is opened but folders)."""
        try:
            with self._parent(rel) as (fd, name):
                return fd is not None and os.stat(name, dir_fd=fd, follow_symlinks=False) is not None
        except (OSError, Refused):
            return False

    def kind(self, rel: str) -> str | None:
        """What `rel` is (kind_of's words), without following it; None when absent."""
        try:
            with self._parent(rel) as (fd, name):
                return (
                    None if fd is None else kind_of(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
                )
        except (OSError, Refused):
            return None

    def size(self, rel: str) -> int | None:
        """The size `rel` has, without following it; None when absent."""
        try:
            with self._parent(rel) as (fd, name):
                return None if fd is None else os.stat(name, dir_fd=fd, follow_symlinks=False).st_size
        except (OSError, Refused):
            return None

    def read(self, rel: str, cap: int) -> bytes | None:
        """The whole file `rel` when it is a regular file of at most `cap` bytes; None when absent or
        refused (the refusal kept)."""
        return self._guarded(rel, lambda f, size: self._take(rel, f, size, cap, whole=True))

    def tail(self, rel: str, cap: int) -> str:
        """The last `cap` bytes of the file `rel`, decoded leniently; "" when absent or refused."""
        data = self._guarded(rel, lambda f, size: self._take(rel, f, size, cap, whole=False))
        return data.decode("utf-8", "replace") if data else ""

    def text(self, rel: str, cap: int) -> str | None:
        """The file `rel` as text (at most `cap` bytes, decoded leniently), or None."""
        data = self.read(rel, cap)
        return None if data is None else data.decode("utf-8", "replace")

    @contextlib.contextmanager
    def open(self, rel: str, cap: int) -> Iterator[BinaryIO | None]:
        """The regular file `rel` open for reading, at most `cap` bytes of it and what is left of the
        budget (a read past either ends as if at the end of the file, and the file counts as refused);
        None when absent or refused."""
        try:
            with self._opened(rel) as opened:
                if opened is None:
                    yield None
                    return
                f, size = opened
                if size > cap:
                    self._refuse(f"{rel} holds {size} bytes, over the {cap} a launch may leave there")
                    yield None
                    return
                if not self._charge(rel, size):
                    yield None
                    return
                reader = io.BufferedReader(_Bounded(f, size))
                try:
                    yield reader  # type: ignore[misc]
                finally:
                    reader.close()
        except Refused as exc:
            self._refuse(str(exc))
            yield None

    def entries(self, rel: str = "") -> list[Entry] | None:
        """The entries of the folder `rel` ("" is the launch directory), each typed without following
        it, at most MAX_ENTRIES; None when absent or refused. Names that are not short printable text
        are refused one by one (left out, the refusal kept)."""
        where = rel or "the launch folder"
        try:
            with self._folder(rel) as fd:
                if fd is None:
                    return None
                found: list[Entry] = []
                with os.scandir(fd) as it:
                    for count, item in enumerate(it):
                        if count >= MAX_ENTRIES:
                            self._refuse(f"{where} holds more than {MAX_ENTRIES} entries")
                            break
                        name = item.name
                        if not _plain_name(name):
                            self._refuse(f"{where} holds an entry whose name is not plain text")
                            continue
                        st = item.stat(follow_symlinks=False)
                        found.append(Entry(name, kind_of(st.st_mode), st.st_size))
                return sorted(found, key=lambda e: e.name)
        except Refused as exc:
            self._refuse(str(exc))
            return None
        except OSError:
            return None

    def copy(self, rel: str, dest: Path, cap: int) -> bool:
        """Copy the regular file `rel` (at most `cap` bytes) to `dest`, a new file of the host's
        (created exclusively, never through a link); False when absent or refused."""
        with self.open(rel, cap) as f:
            if f is None:
                return False
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            with os.fdopen(fd, "wb") as out:
                while chunk := f.read(1 << 20):
                    out.write(chunk)
        return True

    # ------------------------------------------------------------------ the machinery

    def _refuse(self, sentence: str) -> None:
        if sentence not in self.refusals and len(self.refusals) < 64:
            self.refusals.append(sentence)

    def _charge(self, rel: str, size: int) -> bool:
        if self.read_bytes_total + size > self.budget:
            self._refuse(
                f"reading {rel} would take the host past the {self.budget} bytes it reads of one launch"
            )
            return False
        self.read_bytes_total += size
        return True

    def _take(self, rel: str, f: int, size: int, cap: int, whole: bool) -> bytes | None:
        if whole and size > cap:
            self._refuse(f"{rel} holds {size} bytes, over the {cap} a launch may leave there")
            return None
        start = 0 if whole else max(0, size - cap)
        want = min(size, cap)
        if not self._charge(rel, want):
            return None
        os.lseek(f, start, os.SEEK_SET)
        chunks: list[bytes] = []
        left = want
        while left > 0:
            chunk = os.read(f, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _guarded(self, rel: str, use) -> bytes | None:  # type: ignore[no-untyped-def]
        try:
            with self._opened(rel) as opened:
                return None if opened is None else use(*opened)
        except Refused as exc:
            self._refuse(str(exc))
            return None
        except OSError:
            return None

    @contextlib.contextmanager
    def _opened(self, rel: str) -> Iterator[tuple[int, int] | None]:
        """(descriptor, size) of the regular file `rel`, or None when it is absent; Refused when it is
        anything else or sits behind anything but folders."""
        with self._parent(rel) as (parent, name):
            if parent is None:
                yield None
                return
            try:
                before = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                yield None
                return
            if not stat.S_ISREG(before.st_mode):
                raise Refused(f"{rel} was replaced by {kind_of(before.st_mode)}")
            try:
                fd = os.open(name, _FILE_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                yield None
                return
            except OSError as exc:
                raise Refused(f"{rel} could not be opened as a plain file ({exc.strerror})") from None
            try:
                now = os.fstat(fd)
                if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (
                    before.st_dev,
                    before.st_ino,
                ):
                    raise Refused(f"{rel} was swapped for {kind_of(now.st_mode)} while the host read it")
                yield fd, now.st_size
            finally:
                os.close(fd)

    @contextlib.contextmanager
    def _folder(self, rel: str) -> Iterator[int | None]:
        parts = _parts(rel)
        fd = self._open_root()
        try:
            for i, part in enumerate(parts):
                parent, fd = fd, -1  # _step closes the parent whatever happens
                fd = self._step(parent, part, "/".join(parts[: i + 1]))
                if fd < 0:
                    yield None
                    return
            yield fd
        finally:
            if fd >= 0:
                os.close(fd)

    @contextlib.contextmanager
    def _parent(self, rel: str) -> Iterator[tuple[int | None, str]]:
        parts = _parts(rel)
        if not parts:
            raise Refused("the launch folder itself is no file")
        with self._folder("/".join(parts[:-1])) as fd:
            yield fd, parts[-1]

    def _open_root(self) -> int:
        try:
            return os.open(self.root, _DIR_FLAGS)
        except OSError as exc:
            raise Refused(f"the launch folder could not be opened ({exc.strerror})") from None

    @staticmethod
    def _step(fd: int, part: str, shown: str) -> int:
        """The folder `part` under the folder `fd` (closed here), or -1 when absent."""
        try:
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise Refused(f"{shown} was replaced by {kind_of(st.st_mode)}, where a folder belongs")
            return os.open(part, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            return -1
        except OSError as exc:
            raise Refused(f"{shown} could not be opened as a folder ({exc.strerror})") from None
        finally:
            os.close(fd)


# ---------------------------------------------------------------- records read into their types

TEXT_CAP = 16_000  # characters of a string field a record may give
_T = TypeVar("_T")


def typed(value: Any, record: type[_T]) -> _T:
    """`value` (a JSON object a launch wrote) read leniently into the TypedDict `record` of
    harness/contracts.py: only the keys `record` declares are kept, each only where its value has
    the declared type (a string field takes any value, as text of at most TEXT_CAP characters; a
    number is finite; an `X | None` field takes None). Everything else is left out, so the host
    reads a record through its declared keys only, which mypy checks: a key renamed on one side
    fails the type check, not silently."""
    if not isinstance(value, dict):
        return cast(_T, {})
    kept: dict[str, Any] = {}
    for key, kind in get_type_hints(record).items():
        if key in value and (got := _as(value[key], kind)) is not _MISSING:
            kept[key] = got
    return cast(_T, kept)


_MISSING = object()


def _as(value: Any, kind: Any) -> Any:
    """`value` as the type `kind`, or _MISSING."""
    origin, args = get_origin(kind), get_args(kind)
    if origin in (Union, UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            if (got := _as(value, option)) is not _MISSING:
                return got
        return _MISSING
    if origin is NotRequired or origin is Required:
        return _as(value, args[0])
    if kind is str:
        return _MISSING if value is None else (value if isinstance(value, str) else str(value))[:TEXT_CAP]
    if kind is bool:
        return value if type(value) is bool else _MISSING
    if kind is int:
        return value if type(value) is int else _MISSING
    if kind is float:
        ok = type(value) in (int, float) and math.isfinite(value)
        return float(value) if ok else _MISSING
    if origin is list and isinstance(value, list) and len(value) <= MAX_ENTRIES * 4:
        items = [_as(v, args[0]) for v in value]
        return _MISSING if any(i is _MISSING for i in items) else items
    if origin is dict and isinstance(value, dict) and len(value) <= MAX_ENTRIES:
        pairs = {_as(k, args[0]): _as(v, args[1]) for k, v in value.items()}
        return _MISSING if _MISSING in pairs or _MISSING in pairs.values() else pairs
    if isinstance(kind, type) and is_typeddict(kind):
        return typed(value, kind) if isinstance(value, dict) else _MISSING
    return _MISSING


def usage(root: Path, max_entries: int, skip: tuple[str, ...] = ()) -> tuple[int, int]:
    """(bytes, entries) under the folder `root`, a file's bytes the larger of its size and its blocks,
    walked from descriptors without following a link, the top-level entries named in `skip` left
    out; the walk stops once it has seen more than `max_entries` entries (what it saw so far)."""
    used = entries = 0
    with contextlib.suppress(OSError):
        for top, dirs, names, fd in os.fwalk(root, follow_symlinks=False):
            if top == str(root):
                dirs[:] = [d for d in dirs if d not in skip]
                names = [n for n in names if n not in skip]
            for name in (*dirs, *names):
                entries += 1
                with contextlib.suppress(OSError):
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                    # what it holds or will: blocks may be allocated only at writeback
                    used += max(st.st_size, st.st_blocks * 512)
                if entries > max_entries:
                    return used, entries
    return used, entries


class _Bounded(io.RawIOBase):
    """A raw reader of a descriptor that gives at most `limit` bytes (then behaves as at its end)."""

    def __init__(self, fd: int, limit: int) -> None:
        self._fd = os.dup(fd)
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        if self._left <= 0:
            return 0
        view = memoryview(buffer)[: self._left]
        got = os.readv(self._fd, [view])
        self._left -= got
        return got

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def _parts(rel: str) -> list[str]:
    """The components of a path relative to the launch directory; Refused for anything that could
    name a place outside it."""
    if rel.startswith("/") or "\0" in rel:
        raise Refused(f"{rel[:80]!r} is not a path inside the launch")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise Refused(f"{rel[:80]!r} is not a path inside the launch")
    return parts


def _plain_name(name: str) -> bool:
    return 0 < len(name) <= MAX_NAME and name.isprintable() and "/" not in name

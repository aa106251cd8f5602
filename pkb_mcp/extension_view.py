"""A launch's view of the node's extension cache: only the entries of its own build requests, put into
`<launch dir>/.pkb-cache` in the cache's layout (harness/extensions.py VIEW). No launch sees the cache
itself, so nobody's kernels can be listed, read or loaded by another's candidate."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from harness.extensions import VIEW
from pkb_mcp import config
from pkb_mcp.log import get

if TYPE_CHECKING:
    from sandbox.backend import Backend

log = get(__name__)


def use_extension_cache(backend: Backend) -> None:
    """Every launch finds its own entries of the node's extension cache in its view (show_entries): the
    backend points PKB_EXTENSIONS there; no launch sees the cache itself."""
    backend.extensions_dir = config.extensions_dir()  # a capability every Backend declares


VIEW_COPY_CAP = 256 << 20  # an entry copied (not linked) into a view: a precompiled header is left out


def extension_entries(keys: Iterable[str]) -> list[str]:
    """The files of these extension cache entries (built or failed, harness/extensions.py), as paths
    in the cache: what a candidate's launch loads or reports from."""
    root = config.extensions_dir()
    found: list[str] = []
    for key in keys:
        if not KEY.fullmatch(key):
            continue
        with contextlib.suppress(OSError), os.scandir(root / key) as it:
            found += [f"{key}/{e.name}" for e in it if e.is_file(follow_symlinks=False)]
    return found


KEY = re.compile(r"[0-9a-f]{64}")


def show_entries(launch_dir: Path, entries: Iterable[str]) -> int:
    """Put these files of the node's extension cache (paths in it) into the launch's own view,
    `launch_dir`/.pkb-cache, in the cache's layout; the number put there. A launch sees no other
    entry: nobody's kernels can be listed, read or loaded by another's candidate.

    Each is a hard link where the cache and the launch share a file system (else a copy, of at most
    VIEW_COPY_CAP bytes): the same inode as the cache's, so it must stay unchangeable by the launch.
    The files are the host's, written once and never writable by others (0444); the view's folders
    are the host's, 0755, and the hand-over of the launch directory to the sandbox's user leaves the
    view alone (sandbox/docker.py). The launch may rename the view away, which changes only its own
    launch: the host never reads the view back."""
    root = config.extensions_dir()
    view = launch_dir / VIEW
    shown = 0
    for rel in entries:
        source = root / rel
        try:
            st = os.lstat(source)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or ".." in Path(rel).parts:
            continue
        target = view / rel
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        try:
            os.link(source, target, follow_symlinks=False)
        except FileExistsError:
            continue
        except OSError:
            if st.st_size > VIEW_COPY_CAP:
                log.info("view.left_out", entry=rel[:200], bytes=st.st_size)
                continue
            shutil.copyfile(source, target, follow_symlinks=False)
            os.chmod(target, 0o444)
        shown += 1
    return shown

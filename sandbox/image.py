"""The sandbox image for machines that reach no registry: an almost empty root file system.

It holds only the mount points and a passwd file naming the sandbox user; the interpreter, its
libraries and /usr come from the host as read-only bind mounts (sandbox/docker.py). No /etc of the
host, no home directory, no server state goes in. Built with `docker import` from a tar made here,
tagged by the content's hash, so a change of layout makes a new image. For production GPU nodes with
a registry, sandbox/Dockerfile builds a self-contained image instead (PKB_SANDBOX_IMAGE selects it).
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

import docker
import docker.errors

SANDBOX_UID = 65534
SANDBOX_GID = 65534
DIRS = (
    "tmp",
    "launch",
    "opt/pkb/harness",
    "opt/pkb/extensions",
    "etc",
    "proc",
    "sys",
    "dev",
    "usr",
    "sbin",
    "root",
    "home",
)
LINKS = {"bin": "usr/bin", "lib": "usr/lib", "lib64": "usr/lib64"}
FILES = {
    "etc/passwd": (
        f"root:x:0:0::/nonexistent:/usr/sbin/nologin\npkb:x:{SANDBOX_UID}:{SANDBOX_GID}::/launch:/usr/sbin/nologin\n"
    ),
    "etc/group": f"root:x:0:\npkb:x:{SANDBOX_GID}:\n",
    "etc/hosts": "127.0.0.1 localhost\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
}


def rootfs_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in DIRS:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for name, target in LINKS.items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
        for name, text in FILES.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def image_tag(data: bytes | None = None) -> str:
    """The image launches run in: PKB_SANDBOX_IMAGE if set, else the local one's tag (its files' hash)."""
    chosen = os.environ.get("PKB_SANDBOX_IMAGE")
    if chosen:
        return chosen
    return f"pkb-sandbox:local-{hashlib.sha256(rootfs_tar() if data is None else data).hexdigest()[:12]}"


def ensure_image(client: docker.DockerClient) -> str:
    """The image to run launches in: PKB_SANDBOX_IMAGE if set, else the local one (built if missing)."""
    if os.environ.get("PKB_SANDBOX_IMAGE"):
        return image_tag()
    data = rootfs_tar()
    tag = image_tag(data)
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        client.api.import_image_from_data(data, repository=tag.split(":")[0], tag=tag.split(":")[1])
    return tag

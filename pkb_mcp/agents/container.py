"""An agent's client (Claude Code, Codex, ...) in a container of its own (docs/agents.md, "What stays true").

The client is untrusted: it runs shell commands with its permissions bypassed, on the model's say.
So by default it runs here, in a container that holds only what it needs:

- a nearly empty root of our own (an image made locally with `docker import`, tagged by its content:
  mount points, the links /bin, /lib, ... into /usr as the host has them, a passwd naming one user),
  read-only, with a tmpfs /tmp and a tmpfs home for that user;
- the host's /usr read-only (node, bash, coreutils, git, python3 and their libraries), the host's CA
  certificates (/etc/ssl/certs) read-only for HTTPS to the model's provider, /etc/alternatives (the
  links awk and others in /usr/bin go through) read-only, /etc/resolv.conf and /etc/hosts from Docker
  (DNS by the engine);
- the mounts the attempt gives (`Mount`): its workspace and the client's home read-write, the client's
  install folder read-only (`client_mounts`). Nothing else of the host: no repository checkout, no
  /root or /home, no pkb state or cache folder, no /tmp, no Docker socket (a mount holding it is
  refused);
- a user that is not root (uid 65534 when pkb runs as root, the writable mounts then handed to it;
  else the invoking user's own uid, which owns them already), no capabilities, no-new-privileges, a
  pids limit, a memory limit (RAM and swap, the tmpfs folders counted in it), no core dumps, an init
  (docker-init) that reaps and forwards SIGTERM;
- the network `pkb-agents` (`network`): a bridge pkb creates, with outbound traffic (masqueraded) for
  the provider's API and inter-container traffic off, so that attempts do not reach each other.
  pkb's MCP server for the attempt stays on the host (it starts the sandboxes itself) and listens at
  `host_address()`, that bridge's gateway, with a bearer token of the attempt's own.

What a hostile client can still do, and who answers it:

- fork bombs and memory hogs end at its container's limits (`pids`, `memory`); CPU is shared unless
  `cpus` is given;
- the writable mounts are the host's disk: the client can fill them (one file at most FILE_SIZE_CAP,
  but any number of files). Bounding the workspace's size as it goes is the attempt's job;
- its stderr is written to a host file, capped at STDERR_CAP bytes here; its stdout is the attempt's
  to bound as it reads it;
- the network: the internet (it needs its provider; a provider key in its environment is its to use),
  the LAN, a cloud's metadata service (169.254.169.254) where the host has one, and every service of
  the host listening on all addresses or on the gateway (other attempts' pkb servers too, each behind
  its own token; an sshd; a Docker API on TCP if someone enabled one). The host's loopback-only
  services are not reachable. Where that matters, a rule in iptables' DOCKER-USER chain for the
  bridge (`network().attrs["Options"]` names it) restricts it further: pkb does not edit the firewall;
- the engine: no socket, no capability, no privilege gain: the usual container escapes need one;
  a kernel exploit is outside what a container defends.

Ending: `kill_all` sends SIGTERM (through the init to the client), SIGKILL to everything in the
container after END_GRACE_S (the container's pid namespace ends with it, so a child that left its
session with setsid ends too), then removes the container. Every container carries `pkb.agent=<name>`
and `pkb.owner=<host>:<pid>` labels; `sweep` removes those whose pkb process is gone (a crashed run's),
never those of a live pkb process on the same engine, and this process's own when asked.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import select
import shutil
import socket
import struct
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors
import requests.exceptions
from docker.types import Mount as DockerMount
from docker.types import Ulimit

from pkb_mcp.agents.process import END_GRACE_S
from sandbox.docker import DockerUnavailable, _owner_alive, connect, owner_id

LABEL = "pkb.agent"
OWNER_LABEL = "pkb.owner"
NETWORK = "pkb-agents"
NETWORK_LABEL = "pkb.agents"
ICC_OPTION = "com.docker.network.bridge.enable_icc"
IMAGE_REPOSITORY = "pkb-agent"
USER_NAME = "agent"
HOME_INSIDE = f"/home/{USER_NAME}"
NOBODY = 65534
SANDBOX_UID = NOBODY  # the uid the client runs as when pkb runs as root

DEFAULT_MEMORY = 4 << 30  # RAM + swap of one client and the shells it starts
DEFAULT_PIDS = 1024  # processes and threads (node's worker threads count)
TMP_SIZE = 1 << 30  # /tmp, a tmpfs: charged to the memory limit
HOME_SIZE = 256 << 20  # the user's own home, a tmpfs, when HOME is not a mount
FILE_SIZE_CAP = 4 << 30  # RLIMIT_FSIZE: no one file larger, in the mounts or the tmpfs folders
STDERR_CAP = 64 << 20  # bytes of the client's stderr kept on the host
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
CA_CERTS = "/etc/ssl/certs"
# links only (Debian's awk, editor, pager, ... in /usr/bin point there): read-only, nothing secret
ALTERNATIVES = "/etc/alternatives"
# what a mount may not cover inside: the image's own and what the engine provides
RESERVED_INSIDE = ("/usr", "/proc", "/sys", "/dev", "/etc")
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")
WAIT_CALL_S = 1.0  # one engine call waiting for the container's exit
WRITE_POLL_S = 0.2  # how often a blocked copy of stdout checks that the container is being ended


@dataclass(frozen=True)
class Mount:
    """A host folder (or file) at `inside` in the client's container: read-only unless `writable`."""

    host: Path
    inside: str
    writable: bool = False


_client_lock = threading.Lock()
_client: docker.DockerClient | None = None


def _engine() -> docker.DockerClient:
    """The local engine's client, one per process (raises DockerUnavailable when none answers)."""
    global _client
    with _client_lock:
        if _client is None:
            _client = connect()
        return _client


def available() -> bool:
    """Whether a Docker engine answers."""
    try:
        _engine()
    except DockerUnavailable:
        return False
    return True


# ------------------------------------------------------------------------------------------- user


def agent_user() -> tuple[int, int]:
    """The uid and gid the client runs as: nobody's when pkb runs as root (the writable mounts are
    handed to it), else the invoking user's own (who owns them already)."""
    if os.geteuid() == 0:
        return NOBODY, NOBODY
    return os.getuid(), os.getgid()


# ------------------------------------------------------------------------------------------ image

# /sbin is the image's own folder, never a link into the read-only /usr: the engine puts its init there
TOP_DIRS = ("bin", "lib", "lib32", "lib64", "libx32")


def _host_top_links() -> tuple[dict[str, str], list[str]]:
    """The host's /bin, /lib, ...: those that are links (a merged /usr) become the same links in the
    image; those that are folders are mounted read-only."""
    links, folders = {}, []
    for name in TOP_DIRS:
        path = Path("/") / name
        if path.is_symlink():
            links[name] = os.readlink(path).lstrip("/")
        elif path.is_dir():
            folders.append(f"/{name}")
    return links, folders


def rootfs_tar(uid: int, gid: int) -> bytes:
    """The image's root: mount points, the host's top-level links, and /etc's name files."""
    links, folders = _host_top_links()
    dirs = ["tmp", "etc", "etc/ssl", "etc/ssl/certs", "etc/alternatives", "proc", "sys", "dev", "usr"]
    dirs += ["sbin", "home", HOME_INSIDE[1:]]
    dirs += [f[1:] for f in folders]
    files = {
        "etc/passwd": (
            "root:x:0:0::/nonexistent:/usr/sbin/nologin\n"
            f"{USER_NAME}:x:{uid}:{gid}::{HOME_INSIDE}:/bin/bash\n"
        ),
        "etc/group": f"root:x:0:\n{USER_NAME}:x:{gid}:\n",
        "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for name, target in sorted(links.items()):
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ensure_image(client: docker.DockerClient, uid: int, gid: int) -> str:
    """The image for this user, made here if missing (no registry needed), tagged by its content."""
    data = rootfs_tar(uid, gid)
    tag = f"local-{hashlib.sha256(data).hexdigest()[:12]}"
    try:
        client.images.get(f"{IMAGE_REPOSITORY}:{tag}")
    except docker.errors.ImageNotFound:
        client.api.import_image_from_data(data, repository=IMAGE_REPOSITORY, tag=tag)
    return f"{IMAGE_REPOSITORY}:{tag}"


# ---------------------------------------------------------------------------------------- network


def network(client: docker.DockerClient | None = None) -> Any:
    """The agents' network: a bridge with outbound traffic and no traffic between its containers,
    made here if missing. Two pkb processes making it at once may both succeed (the engine allows two
    networks of one name): the oldest is the one every process uses."""
    client = client or _engine()
    found = [n for n in client.networks.list(names=[NETWORK]) if n.name == NETWORK]
    if not found:
        with contextlib.suppress(docker.errors.APIError):
            client.networks.create(
                NETWORK,
                driver="bridge",
                options={ICC_OPTION: "false"},
                labels={NETWORK_LABEL: "1"},
                check_duplicate=True,
            )
        found = [n for n in client.networks.list(names=[NETWORK]) if n.name == NETWORK]
    if not found:
        raise RuntimeError(f"the Docker network {NETWORK!r} could not be made")
    chosen = client.networks.get(min(found, key=lambda n: (n.attrs.get("Created", ""), n.id)).id)
    if chosen.attrs.get("Options", {}).get(ICC_OPTION) != "false":
        raise RuntimeError(
            f"the Docker network {NETWORK!r} lets its containers reach each other ({ICC_OPTION} is not "
            "false); remove it (`docker network rm pkb-agents`) and pkb makes its own"
        )
    return chosen


def prepare() -> None:
    """The agents' image and network, made once before any attempt (attempts that start together then
    find them made rather than racing to make them); the agents' containers of dead pkb processes
    removed."""
    client = _engine()
    ensure_image(client, *agent_user())
    network(client)
    sweep()  # what a crashed run left


def host_address() -> str:
    """The host's address on the agents' network (its bridge's gateway): where an attempt's pkb
    server listens for the client in the container."""
    for block in network().attrs.get("IPAM", {}).get("Config") or []:
        gateway = str(block.get("Gateway", "")).split("/")[0]
        if gateway and ":" not in gateway:
            return gateway
    raise RuntimeError(f"the Docker network {NETWORK!r} has no IPv4 gateway")


# ----------------------------------------------------------------------------------------- mounts


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def client_mounts(executable: Path) -> list[Mount]:
    """The read-only mounts the client's executable needs, at their host paths: nothing for one under
    /usr (mounted already); for a Node package, the outermost `node_modules` folder holding it (its
    platform binaries may be sibling packages), else the package's folder; for anything else, the
    file itself. A link is followed: `launch` runs the real file when the link is not visible."""
    path = Path(executable)
    if not path.is_absolute():
        found = shutil.which(str(path))
        if found is None:
            raise FileNotFoundError(f"no {executable} on PATH")
        path = Path(found)
    real = Path(os.path.realpath(path))
    if _under(str(real), "/usr"):
        return []
    parts = real.parts
    if "node_modules" in parts:
        root = Path(*parts[: parts.index("node_modules") + 1])
    else:
        root = next((p for p in real.parents if (p / "package.json").is_file()), real)
        if root == Path("/") or str(root) in ("/root", "/home") or root.parent == Path("/home"):
            root = real
    return [Mount(root, str(root))]


def _docker_sockets() -> list[str]:
    sockets = [os.path.realpath(s) for s in DOCKER_SOCKETS if os.path.exists(s)]
    given = os.environ.get("DOCKER_HOST", "")
    if given.startswith("unix://"):
        sockets.append(os.path.realpath(given.removeprefix("unix://")))
    return sockets


def _checked(mounts: list[Mount]) -> list[Mount]:
    """The mounts, each checked: an absolute inside path outside the image's own folders, a host path
    that exists and holds no Docker socket; exact repeats dropped."""
    kept: dict[str, Mount] = {}
    sockets = _docker_sockets()
    for m in mounts:
        inside = os.path.normpath(m.inside)
        if not inside.startswith("/") or inside == "/":
            raise ValueError(f"a mount's inside path must be an absolute folder below /, not {m.inside!r}")
        if any(_under(inside, r) for r in RESERVED_INSIDE):
            raise ValueError(f"{m.inside} is the container's own (one of {', '.join(RESERVED_INSIDE)})")
        host = os.path.realpath(m.host)
        if not os.path.exists(host):
            raise FileNotFoundError(f"no {m.host} to mount")
        if any(_under(s, host) for s in sockets):
            raise ValueError(f"{m.host} holds the Docker socket: never mounted into an agent's container")
        m = Mount(Path(host), inside, m.writable)
        if inside in kept and kept[inside] != m:
            raise ValueError(f"two different mounts at {inside}")
        kept[inside] = m
    return list(kept.values())


def _hand_over(root: Path, uid: int, gid: int) -> None:
    """A writable mount's tree to the client's user (links left alone: nothing is followed)."""
    if root.is_symlink():
        return
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for path in paths:
        if not path.is_symlink():
            os.chown(path, uid, gid, follow_symlinks=False)


def _inside_path(host: Path, mounts: list[Mount]) -> str | None:
    """Where a host path is seen in the container, if a mount holds it (the deepest mount wins)."""
    real = os.path.realpath(host)
    best: Mount | None = None
    for m in mounts:
        if _under(real, str(m.host)) and (best is None or len(str(m.host)) > len(str(best.host))):
            best = m
    if best is None:
        return None
    rest = os.path.relpath(real, best.host)
    return best.inside if rest == "." else f"{best.inside.rstrip('/')}/{rest}"


def _visible(inside: str, mounts: list[Mount]) -> bool:
    return _under(inside, "/usr") or any(_under(inside, m.inside) for m in mounts)


# -------------------------------------------------------------------------------------- the client

_SAFE_NAME = re.compile(r"[^a-zA-Z0-9_.-]")


class ContainerProcess:
    """The client in its container (the `Launched` protocol of process.py). Its attached stream is
    read by a thread: stdout's bytes go to a pipe (`stdout`) as they come, stderr's to a host file."""

    stdout: IO[bytes]

    def __init__(
        self, client: docker.DockerClient, container: Any, sock: Any, stderr: Path, stdin: bytes | None
    ):
        self._client = client
        self.container = container
        self.name = container.name
        self._sock = sock
        self._raw = getattr(sock, "_sock", sock)  # the socket under docker's SocketIO wrapper
        self._raw.settimeout(None)  # a client quiet for long is not an engine that stopped answering
        self._stderr = stderr.open("wb")
        self._stderr_left = STDERR_CAP
        read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self.stdout = open(read_fd, "rb")  # noqa: SIM115 (the caller's to read and close)
        self._ending = threading.Event()
        self._exited = threading.Event()
        self._code: int | None = None
        self._reader = threading.Thread(target=self._read, name=f"pkb-agent-out-{self.name}", daemon=True)
        self._waiter = threading.Thread(target=self._wait, name=f"pkb-agent-wait-{self.name}", daemon=True)
        self._stdin = stdin
        self._reader.start()

    def _started(self) -> None:
        self._waiter.start()
        if self._stdin is not None:
            threading.Thread(target=self._feed, args=(self._stdin,), daemon=True).start()

    # -- the attached stream

    def _feed(self, data: bytes) -> None:
        """stdin's bytes, then its end (half-closing the stream: the engine closes the client's stdin)."""
        with contextlib.suppress(OSError):
            self._raw.sendall(data)
            self._raw.shutdown(socket.SHUT_WR)

    def _recv_exact(self, n: int) -> bytes | None:
        chunks, left = [], n
        while left:
            chunk = self._raw.recv(min(left, 1 << 16))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _read(self) -> None:
        """Frames of the multiplexed stream (8-byte header: the stream, 3 zero bytes, the length) until
        it ends: the container exited or was removed. Once stdout has no reader left (closed, or the
        container being ended with the pipe full), its frames are read and dropped: an engine that
        cannot hand over the container's output does not let the container end."""
        to_stdout = True
        try:
            while True:
                header = self._recv_exact(8)
                if header is None:
                    return
                kind, size = header[0], struct.unpack(">I", header[4:])[0]
                data = self._recv_exact(size) if size else b""
                if data is None:
                    return
                if kind == 1 and to_stdout:
                    if not self._to_stdout(data):
                        to_stdout = False
                        with contextlib.suppress(OSError):
                            os.close(self._write_fd)
                elif kind == 2:
                    self._to_stderr(data)
        except OSError:
            return
        finally:
            if to_stdout:
                with contextlib.suppress(OSError):
                    os.close(self._write_fd)
            with contextlib.suppress(OSError, ValueError):
                self._stderr.flush()

    def _to_stdout(self, data: bytes) -> bool:
        """Write to the pipe, waiting while it is full; False once the reader closed it or the
        container is being ended (what is in the pipe stays readable)."""
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._write_fd, view) :]
            except BlockingIOError:
                if self._ending.is_set():
                    return False
                select.select([], [self._write_fd], [], WRITE_POLL_S)
            except BrokenPipeError:
                return False
        return True

    def _to_stderr(self, data: bytes) -> None:
        if self._stderr_left <= 0:
            return
        kept = data[: self._stderr_left]
        self._stderr_left -= len(kept)
        with contextlib.suppress(OSError, ValueError):
            self._stderr.write(kept)
            if self._stderr_left <= 0:
                self._stderr.write(f"\n[pkb: stderr cut at {STDERR_CAP} bytes]\n".encode())
            self._stderr.flush()

    def _wait(self) -> None:
        """The container's exit status, once it exits (an engine call at a time, WAIT_CALL_S long)."""
        try:
            while True:
                try:
                    self._code = int(self.container.wait(timeout=WAIT_CALL_S)["StatusCode"])
                    return
                except (requests.exceptions.ConnectionError, requests.exceptions.ReadTimeout):
                    continue
                except docker.errors.NotFound:
                    self._code = 137  # removed before its exit was seen: killed (128 + SIGKILL)
                    return
                except docker.errors.APIError:
                    if self._ending.is_set():
                        self._code = 137
                        return
                    time.sleep(WAIT_CALL_S)
        finally:
            self._exited.set()

    # -- Launched

    def poll(self) -> int | None:
        """The client's exit status (the container's: 128 + N when signal N ended it), or None."""
        return self._code if self._exited.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
        assert self._code is not None
        return self._code

    def kill_all(self) -> None:
        """SIGTERM to the client (through the init), SIGKILL to all in the container after
        END_GRACE_S, then the container removed. Idempotent: a call after the first removes what an
        earlier one could not."""
        self._ending.set()
        with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
            self.container.stop(timeout=int(END_GRACE_S))
        with contextlib.suppress(docker.errors.NotFound):
            try:
                self.container.remove(force=True)
            except (docker.errors.APIError, requests.exceptions.RequestException):
                time.sleep(0.5)  # the engine may still be tearing it down: once more
                with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
                    self.container.remove(force=True)
        with contextlib.suppress(OSError):
            self._raw.shutdown(socket.SHUT_RDWR)  # wakes the reader; the socket is closed once it is done
        self._reader.join(5)
        if not self._reader.is_alive():
            with contextlib.suppress(OSError):
                self._raw.close()
        if self._waiter.ident is None:  # never started: the container's start failed
            self._code = 137
            self._exited.set()
        else:
            self._waiter.join(5)
        with contextlib.suppress(OSError, ValueError):
            self._stderr.close()

    def leftovers(self) -> list[str]:
        """The container if it still exists (running or not): `container NAME STATUS`."""
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return []
        except (docker.errors.APIError, requests.exceptions.RequestException) as exc:
            return [f"container {self.name} (the engine did not say: {exc})"]
        return [f"container {self.name} {self.container.status}"]


def launch(
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    mounts: list[Mount],
    stderr: Path,
    stdin: bytes | None,
    name: str,
    labels: dict[str, str],
    memory: int = DEFAULT_MEMORY,
    pids: int = DEFAULT_PIDS,
    cpus: float | None = None,
) -> ContainerProcess:
    """Start `argv` in a container of its own (the module's docstring says what it holds).

    `cwd` is a host path inside one of the mounts (or a path inside the container). `env` is the
    client's whole environment (nothing of pkb's is added): HOME defaults to the user's tmpfs home,
    PATH to /usr's folders; a HOME outside /tmp, that home and the writable mounts is refused. A host
    path as argv[0] that the container does not see (a link into a mounted package) is replaced by
    the real file's path inside. `name` is the container's name and its `pkb.agent` label."""
    if not argv:
        raise ValueError("no command to launch")
    client = _engine()
    uid, gid = agent_user()
    mounts = _checked(mounts)
    env = dict(env)
    env.setdefault("HOME", HOME_INSIDE)
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("USER", USER_NAME)
    env.setdefault("SHELL", "/bin/bash")
    home = os.path.normpath(env["HOME"])
    if not (
        _under(home, "/tmp")
        or _under(home, HOME_INSIDE)
        or any(m.writable and _under(home, m.inside) for m in mounts)
    ):
        raise ValueError(f"HOME={env['HOME']} is not writable in the container: make it a writable mount")
    workdir = _inside_path(cwd, mounts)
    if workdir is None:
        if not (str(cwd).startswith("/") and _visible(os.path.normpath(cwd), mounts)):
            raise ValueError(f"the working folder {cwd} is in none of the mounts")
        workdir = os.path.normpath(cwd)
    argv = list(argv)
    if argv[0].startswith("/") and not _visible(os.path.normpath(argv[0]), mounts):
        real = _inside_path(Path(argv[0]), mounts)
        if real is None:
            raise FileNotFoundError(f"{argv[0]} is not visible in the container: see client_mounts")
        argv[0] = real
    if os.geteuid() == 0:
        for m in mounts:
            if m.writable:
                _hand_over(m.host, uid, gid)
    _, top_folders = _host_top_links()
    docker_mounts = [
        DockerMount("/usr", "/usr", type="bind", read_only=True),
        *[DockerMount(f, f, type="bind", read_only=True) for f in top_folders],
        *[DockerMount(m.inside, str(m.host), type="bind", read_only=not m.writable) for m in mounts],
    ]
    for shared in (CA_CERTS, ALTERNATIVES):
        if os.path.isdir(shared):
            docker_mounts.append(DockerMount(shared, shared, type="bind", read_only=True))
    tmpfs = {"/tmp": f"rw,exec,nosuid,nodev,size={TMP_SIZE},mode=1777"}
    if not any(m.inside == HOME_INSIDE for m in mounts):
        tmpfs[HOME_INSIDE] = f"rw,exec,nosuid,nodev,size={HOME_SIZE},mode=0700,uid={uid},gid={gid}"
    image = ensure_image(client, uid, gid)
    container = client.containers.create(
        image,
        argv,
        name=_SAFE_NAME.sub("-", name)[:120],
        hostname=USER_NAME,
        user=f"{uid}:{gid}",
        working_dir=workdir,
        environment=env,
        mounts=docker_mounts,
        tmpfs=tmpfs,
        network=network(client).id,
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=pids,
        mem_limit=memory,
        memswap_limit=memory,
        nano_cpus=int(cpus * 1e9) if cpus else None,
        ulimits=[
            Ulimit(name="fsize", soft=FILE_SIZE_CAP, hard=FILE_SIZE_CAP),
            Ulimit(name="core", soft=0, hard=0),
        ],
        init=True,
        ipc_mode="private",
        labels={**labels, LABEL: name, OWNER_LABEL: owner_id()},
        stdin_open=stdin is not None,
        tty=False,
        log_config={"type": "none"},  # its output is read as it comes, never kept by the engine
    )
    proc: ContainerProcess | None = None
    try:
        # attached before it starts: none of its output is missed, and the engine keeps none of it
        params = {"stdout": 1, "stderr": 1, "stream": 1, "stdin": 1 if stdin is not None else 0}
        sock = client.api.attach_socket(container.id, params=params)
        proc = ContainerProcess(client, container, sock, stderr, stdin)
        container.start()
        proc._started()
    except BaseException:
        if proc is not None:
            proc.kill_all()
        else:
            with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
                container.remove(force=True)
        raise
    return proc


def sweep(*, include_own: bool = False) -> list[str]:
    """Remove the agents' containers whose pkb process is gone (a crashed run's), and this process's
    own when `include_own` (a run that ends); those of other live pkb processes on the engine stay.
    Returns the names removed."""
    client = _engine()
    removed = []
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        owner = container.labels.get(OWNER_LABEL, "")
        if _owner_alive(owner) and not (include_own and owner == owner_id()):
            continue
        with contextlib.suppress(docker.errors.NotFound):
            try:
                container.remove(force=True)
            except docker.errors.APIError:
                continue
            removed.append(container.name)
    return removed

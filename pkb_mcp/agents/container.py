"""An agent's client in a container of its own (`--agent-sandbox docker`, the default).

The client runs shell commands with its permissions bypassed, so it is untrusted like a candidate.
Its container: pkb's nearly empty sandbox root (sandbox/image.py) with the host's /usr read-only (node,
a shell, git, python), the CA bundle read-only, the attempt's workspace and client home read-write at
their host paths, the client's own files read-only; nothing else of the host (no repository, no
pkb state or cache, no other attempt, no Docker socket, no /tmp). It runs as the sandbox's unprivileged
user with no capabilities, no new privileges, a read-only root, a pids and a memory limit, on a bridge
network of pkb's own (`pkb-agents`, containers unable to reach each other) that reaches the
provider and, at the network's gateway, the attempt's pkb server (HTTP, a token of the attempt's
own). What it can still reach: the internet, and the host's ports on that gateway address (pkb's
servers answer only their own token); its writable mounts are host folders (their size is not
capped here).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

NETWORK = "pkb-agents"
LABEL = "pkb.agent"
SANDBOX_UID = 65534
MEMORY = "8g"
PIDS = 1024


@dataclass(frozen=True)
class Mount:
    host: Path
    inside: str
    writable: bool = False


def _client() -> Any:
    from sandbox.docker import connect

    return connect()


def available() -> bool:
    try:
        _client().ping()
    except Exception:
        return False
    return True


def _network(client: Any) -> Any:
    import docker.errors

    try:
        return client.networks.get(NETWORK)
    except docker.errors.NotFound:
        return client.networks.create(
            NETWORK, driver="bridge", options={"com.docker.network.bridge.enable_icc": "false"}
        )


def host_address() -> str:
    """The host's address on pkb's agents network: where the attempt's pkb server listens."""
    net = _network(_client())
    net.reload()
    return str(net.attrs["IPAM"]["Config"][0]["Gateway"])


def client_mounts(executable: Path) -> list[Mount]:
    """The client's own files: its npm prefix (the folder above node_modules), read-only."""
    real = executable.resolve()
    if str(real).startswith("/usr/"):
        return []  # the host's /usr is mounted already
    for parent in real.parents:
        if parent.name == "node_modules":
            return [Mount(parent.parent, str(parent.parent))]
    return [Mount(real.parent, str(real.parent))]


class ContainerProcess:
    """A started client container (the `Launched` of pkb_mcp/agents/process.py)."""

    def __init__(self, container: Any, stderr: Path):
        self.container = container
        read, write = os.pipe()
        self.stdout: IO[bytes] = os.fdopen(read, "rb")
        self._done = False
        self._threads = [
            threading.Thread(target=self._pump, args=(os.fdopen(write, "wb"), True, False), daemon=True),
            threading.Thread(target=self._pump, args=(stderr.open("wb"), False, True), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump(self, sink: Any, stdout: bool, stderr: bool) -> None:
        with contextlib.suppress(Exception), sink:
            for chunk in self.container.logs(stdout=stdout, stderr=stderr, stream=True, follow=True):
                sink.write(chunk)
                sink.flush()

    def poll(self) -> int | None:
        try:
            self.container.reload()
        except Exception:
            return -1
        if self.container.status in ("exited", "dead"):
            return int(self.container.attrs["State"]["ExitCode"])
        return None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("the client's container is still running")
            time.sleep(0.2)
        return code

    def kill_all(self) -> None:
        """The container and everything in it: killed, then removed (idempotent)."""
        with contextlib.suppress(Exception):
            self.container.kill()
        for t in self._threads:
            t.join(5)
        with contextlib.suppress(Exception):
            self.container.remove(force=True)

    def leftovers(self) -> list[str]:
        import docker.errors

        try:
            self.container.reload()
        except docker.errors.NotFound:
            return []
        except Exception as exc:
            return [f"container {self.container.name}: {exc}"]
        return [f"container {self.container.name} ({self.container.status})"]


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
) -> ContainerProcess:
    from sandbox.image import ensure_image

    client = _client()
    image = ensure_image(client)
    volumes: dict[str, dict[str, str]] = {"/usr": {"bind": "/usr", "mode": "ro"}}
    if Path("/etc/ssl/certs").is_dir():
        volumes["/etc/ssl/certs"] = {"bind": "/etc/ssl/certs", "mode": "ro"}
    for m in mounts:
        if m.writable and os.geteuid() == 0:
            for root, dirs, files in os.walk(m.host):
                for item in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    with contextlib.suppress(OSError):
                        os.lchown(item, SANDBOX_UID, SANDBOX_UID)
        volumes[str(m.host)] = {"bind": m.inside, "mode": "rw" if m.writable else "ro"}
    given = "/dev/null"
    if stdin is not None:
        home = next((m for m in mounts if m.writable and m.host != cwd), mounts[0])
        (home.host / ".pkb-stdin").write_bytes(stdin)
        given = f"{home.inside}/.pkb-stdin"
    container = client.containers.run(
        image,
        ["/bin/sh", "-c", 'exec "$@" < "$0"', given, *argv],
        detach=True,
        name=name,
        labels={LABEL: name, **labels},
        environment={**env, "TMPDIR": "/tmp"},
        working_dir=str(cwd),
        user=f"{SANDBOX_UID}:{SANDBOX_UID}",
        volumes=volumes,
        network=_network(client).name,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        pids_limit=PIDS,
        mem_limit=MEMORY,
        read_only=True,
        tmpfs={"/tmp": "size=2g"},
    )
    return ContainerProcess(container, stderr)

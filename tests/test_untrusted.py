"""sandbox/untrusted.py: the host's one doorway into a launch directory. Every hostile shape a
candidate can give a file it knows the host reads (a link to a host secret, a link to /dev/zero, a
FIFO, a folder, a huge file, a link on the way to it) is refused with a sentence, never read, never
blocking."""

import os
import threading

import pytest

from sandbox.untrusted import LaunchFiles, Refused, _parts

SECRET = "canary-7f3a9-host-secret"


@pytest.fixture
def launch(tmp_path):
    root = tmp_path / "launch"
    root.mkdir()
    (root / "out").mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    return root, secret


def hostile(root, secret, name, shape):
    """Make `root/name` into `shape`."""
    path = root / name
    if shape == "link to a host secret":
        os.symlink(secret, path)
    elif shape == "link to /dev/zero":
        os.symlink("/dev/zero", path)
    elif shape == "link to /proc/self/environ":
        os.symlink("/proc/self/environ", path)
    elif shape == "FIFO":
        os.mkfifo(path)
    elif shape == "folder":
        path.mkdir()
    elif shape == "huge file":
        with open(path, "wb") as f:
            f.truncate(64 << 30)  # sparse: 64 GiB that the host must never read
    else:
        raise AssertionError(shape)


SHAPES = [
    "link to a host secret",
    "link to /dev/zero",
    "link to /proc/self/environ",
    "FIFO",
    "folder",
    "huge file",
]


def read_all_ways(files, name):
    """Every read of LaunchFiles, each in a thread that must end within a few seconds."""
    got = {}

    def go():
        got["read"] = files.read(name, 1 << 20)
        got["tail"] = files.tail(name, 4096)
        got["text"] = files.text(name, 1 << 20)
        with files.open(name, 1 << 20) as f:
            got["open"] = f.read() if f is not None else None

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "a read blocked"
    return got


@pytest.mark.parametrize("shape", SHAPES)
def test_every_hostile_shape_is_refused_with_a_sentence_and_never_read(launch, shape, monkeypatch):
    root, secret = launch
    monkeypatch.setenv("PKB_TOKEN", SECRET)
    hostile(root, secret, "rank0.log", shape)
    files = LaunchFiles(root)
    got = read_all_ways(files, "rank0.log")
    assert got["read"] is None and got["text"] is None and got["open"] is None
    assert SECRET not in got["tail"]
    assert files.read_bytes_total <= 4096
    assert files.refusals and all("rank0.log" in r for r in files.refusals), files.refusals
    if shape.startswith("link"):
        assert "symbolic link" in files.refusals[0]


@pytest.mark.parametrize("shape", ["link to a host secret", "FIFO", "huge file"])
def test_a_folder_on_the_way_that_is_not_a_folder_is_refused(launch, shape, tmp_path):
    root, secret = launch
    os.rmdir(root / "out")
    if shape == "link to a host secret":
        os.symlink(tmp_path, root / "out")  # out/ -> the folder that holds the secret
    else:
        hostile(root, secret, "out", shape)
    files = LaunchFiles(root)
    assert files.read("out/secret.txt", 1 << 20) is None
    assert files.entries("out") is None
    assert files.refusals and "out" in files.refusals[0]


def test_plain_files_are_read_and_their_bytes_charged(launch):
    root, _ = launch
    (root / "launch.json").write_text('{"ranks": []}')
    (root / "rank0.log").write_bytes(b"x" * 10_000 + b"the end")
    files = LaunchFiles(root)
    assert files.read("launch.json", 100) == b'{"ranks": []}'
    assert files.tail("rank0.log", 7) == "the end"
    assert files.read_bytes_total == len('{"ranks": []}') + 7
    assert files.read("missing.json", 100) is None and files.tail("missing.log", 10) == ""
    assert files.refusals == [], "an absent file is no refusal"


def test_a_file_over_its_cap_is_refused_whole_and_tailed(launch):
    root, _ = launch
    (root / "timing.json").write_bytes(b"{" * 5000)
    files = LaunchFiles(root)
    assert files.read("timing.json", 4096) is None
    assert "5000 bytes" in files.refusals[0]
    assert files.tail("timing.json", 10) == "{" * 10


def test_the_launch_wide_budget_bounds_what_the_host_reads(launch):
    root, _ = launch
    for i in range(5):
        (root / "out" / f"t{i}.bin").write_bytes(b"y" * 1000)
    files = LaunchFiles(root, budget=2500)
    got = [files.read(f"out/t{i}.bin", 1 << 20) for i in range(5)]
    assert [g is not None for g in got] == [True, True, False, False, False]
    assert files.read_bytes_total == 2000
    assert "2500 bytes" in files.refusals[0]


def test_an_open_file_gives_no_more_than_its_size_when_it_was_opened(launch):
    root, _ = launch
    path = root / "out" / "t0_r0.pkbt"
    path.write_bytes(b"a" * 100)
    files = LaunchFiles(root)
    with files.open("out/t0_r0.pkbt", 1000) as f:
        assert f is not None
        with open(path, "ab") as grow:  # a writer still at work cannot make the host read more
            grow.write(b"b" * 10_000)
        assert f.read() == b"a" * 100
    with files.open("out/t0_r0.pkbt", 1000) as f:
        assert f is None  # now 10,100 bytes: over its cap
    assert "10100 bytes" in files.refusals[-1]


def test_folders_are_listed_typed_without_following_links(launch):
    root, secret = launch
    (root / "out" / "t0_r0.pkbt").write_bytes(b"z")
    os.symlink(secret, root / "out" / "t1_r0.pkbt")
    os.mkfifo(root / "out" / "t2_r0.pkbt")
    (root / "out" / "sub").mkdir()
    files = LaunchFiles(root)
    kinds = {e.name: e.kind for e in files.entries("out")}
    assert kinds == {
        "t0_r0.pkbt": "a file",
        "t1_r0.pkbt": "a symbolic link",
        "t2_r0.pkbt": "a FIFO",
        "sub": "a folder",
    }
    assert files.kind("out/t1_r0.pkbt") == "a symbolic link" and files.kind("nothing") is None


def test_copy_makes_a_new_host_file_and_refuses_a_link(launch, tmp_path):
    root, secret = launch
    (root / "built.so").write_bytes(b"ELF")
    os.symlink(secret, root / "planted.so")
    files = LaunchFiles(root)
    assert files.copy("built.so", tmp_path / "kept.so", 100) and (tmp_path / "kept.so").read_bytes() == b"ELF"
    assert not files.copy("planted.so", tmp_path / "planted.so", 100)
    assert not (tmp_path / "planted.so").exists()


@pytest.mark.parametrize("rel", ["/etc/passwd", "../secret.txt", "out/../../secret.txt", "a\0b"])
def test_no_path_can_name_a_place_outside_the_launch(rel, launch):
    root, _ = launch
    files = LaunchFiles(root)
    assert files.read(rel, 100) is None and files.refusals
    with pytest.raises(Refused):
        _parts(rel)


# ---------------------------------------------------------------- what a launch may take of the node


def test_the_disk_guard_names_a_folder_over_its_cap_or_with_too_many_entries(tmp_path, monkeypatch):
    from sandbox import base

    monkeypatch.setattr(base, "DISK_POLL_S", 0.0)
    root = tmp_path / "launch"
    root.mkdir()
    guard = base.DiskGuard(root, cap=1 << 20)
    (root / "small").write_bytes(b"x" * 1000)
    assert guard.over() is None
    (root / "out").mkdir()
    (root / "out" / "big").write_bytes(b"x" * (2 << 20))
    assert "limit of 0.000977 GiB" in (guard.over() or "")
    (root / "out" / "big").unlink()
    (root / ".pkb-cache").mkdir()  # the host's hard links of the launch's own cache entries
    (root / ".pkb-cache" / "ext.so").write_bytes(b"x" * (2 << 20))
    assert guard.over() is None, "the cache view is the host's, not what the launch wrote"
    os.symlink("/", root / "everything")  # a link to the root of the host counts as a link, not its tree
    assert guard.over() is None
    monkeypatch.setattr(base, "MAX_LAUNCH_ENTRIES", 50)
    for i in range(60):
        (root / f"f{i}").touch()
    assert "more than 50 files and folders" in (guard.over() or "")


def test_memory_is_fitted_to_the_node_and_the_tmpfs_folders_within_it(monkeypatch):
    from sandbox import base, docker

    monkeypatch.delenv("PKB_SANDBOX_MEMORY", raising=False)
    monkeypatch.delenv("PKB_SANDBOX_CONCURRENT", raising=False)
    monkeypatch.setattr(base, "node_memory", lambda: 23_500 << 20)  # this CI machine's 23.5 GiB
    memory, tmp, shm = docker.memory_limits()
    assert memory == int((23_500 << 20) * 0.8) // 2 and tmp == memory // 2 and shm == memory // 4
    assert memory + 0 < 23_500 << 20, "two sandboxes at once fit the node"
    monkeypatch.setenv("PKB_SANDBOX_CONCURRENT", "4")
    assert docker.memory_limits()[0] == int((23_500 << 20) * 0.8) // 4
    monkeypatch.setattr(base, "node_memory", lambda: 2 << 40)
    assert docker.memory_limits()[0] == base.MEMORY_CAP
    monkeypatch.setenv("PKB_SANDBOX_MEMORY", "3g")
    assert docker.memory_limits() == (3 << 30, 3 << 29, 3 << 28)
    assert [base.parse_size(s) for s in ("512m", "2G", "1048576", "1k")] == [
        512 << 20,
        2 << 30,
        1 << 20,
        1024,
    ]
    with pytest.raises(ValueError, match="not a size"):
        base.parse_size("lots")


# ---------------------------------------------------------------- records read into their types


def test_records_keep_only_their_declared_keys_each_of_its_declared_type():
    from harness.contracts import LaunchRecord, RankRecord
    from sandbox.untrusted import TEXT_CAP, typed

    rank = typed(
        {
            "rank": 0,
            "state": "ok",
            "error": ["not", "a", "string"],  # a string field takes anything, as text
            "stage": None,  # but not None, which it does not declare
            "cpus": "0-3",  # a list of CPUs, not a string
            "stages": {"import": 1, "run": float("nan")},  # a map of finite seconds
            "elapsed_s": True,  # a bool is no number
            "traceback": "x" * (TEXT_CAP + 10),
            "planted": "a key nobody declared",
        },
        RankRecord,
    )
    assert rank == {"rank": 0, "state": "ok", "error": "['not', 'a', 'string']", "traceback": "x" * TEXT_CAP}
    record = typed(
        {"ranks": [{"rank": 1, "exit_code": None, "signal": 9}], "wall_s": 3, "timed_out": "no"}, LaunchRecord
    )
    assert record == {"ranks": [{"rank": 1, "exit_code": None, "signal": "9"}], "wall_s": 3.0}
    assert typed(["not", "an", "object"], LaunchRecord) == {}


def test_a_rank_s_log_is_capped_where_it_is_written_and_keeps_its_last_lines(tmp_path, monkeypatch):
    """harness/launch.py RankLog: a rank printing without end (before: 20 GiB on the host's disk)
    leaves its first LOG_HEAD bytes, a line saying how much was cut, and its last LOG_TAIL bytes."""
    import subprocess
    import sys

    from harness import launch

    monkeypatch.setattr(launch, "LOG_HEAD", 1000)
    monkeypatch.setattr(launch, "LOG_TAIL", 100)
    log = launch.RankLog(tmp_path / "rank0.log")
    script = (
        "import sys\nfor i in range(100000): sys.stdout.write(f'line {i}\\n')\nprint('Traceback: the end')"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=log.write_fd, stderr=subprocess.STDOUT)
    log.handed_over()
    child.wait(60)
    log.join(10)
    assert not log.is_alive()
    text = (tmp_path / "rank0.log").read_text()
    head, _, rest = text.partition("\n[pkb: ")
    assert len(head) == 1000 and head.startswith("line 0\n")
    cut, _, tail = rest.partition("\n")
    assert cut.endswith("bytes of this rank's output left out]") and int(cut.split()[0]) > 500_000
    assert len(tail) == 100 and tail.endswith("Traceback: the end\n")

"""The safe tensor file: a JSON header and raw little-endian bytes; never pickle.

Workers write outputs with `save`; the host reads them with `load`, which trusts nothing in the file:
the magic, header size, dtype names, shapes, offsets and the total size are all checked against caps
before a byte of data is interpreted. Imports torch and the standard library only.

Layout: b"PKBT1\\n" | u64 header length | header JSON | data. The header holds
{"structure": (harness/structure.py), "tensors": [{"dtype", "shape", "offset", "nbytes"}...],
"meta": {...}}.

Forgery: candidate code runs in the process (and as the user) that writes these files, so it can
rewrite them. Given a key (`result_key`, derived from the launch's secret seeds, which only the launch's
ranks and the host know), `save` puts a keyed BLAKE2b digest of everything in the file into
meta["mac"], and the host's `verify` rejects a file rewritten without the key; `mac_record` and
`verify_record` do the same for the timing record. Code that digs the key out of the harness's
memory could still forge: this stops file forgery, not an attacker inside the process.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from harness import structure as output_structure

MAGIC = b"PKBT1\n"
MAX_HEADER_BYTES = 1 << 20
MAX_TENSORS = 64  # tensors a result file may hold, unless the problem raises it (its MAX_OUTPUTS) ...
HARD_MAX_TENSORS = 1024  # ... up to this

DTYPE_NAMES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
_NAME_OF = {v: k for k, v in DTYPE_NAMES.items()}


class TensorFileError(ValueError):
    """The file is not a well-formed tensor file within the caps."""


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _NAME_OF:
        raise TensorFileError(f"dtype {dtype} cannot be stored")
    return _NAME_OF[dtype]


def result_key(seeds: list[int]) -> bytes:
    """The key of a launch's result digests: known to the host and to the launch's ranks only."""
    return hashlib.sha256(b"pkb-result-mac\0" + json.dumps([int(s) for s in seeds]).encode()).digest()


def _raw(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to("cpu").contiguous()
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def _bytes_of(raw: torch.Tensor) -> memoryview:
    # zero-copy view of contiguous CPU bytes (no numpy in the sandbox image)
    return memoryview((ctypes.c_char * raw.numel()).from_address(raw.data_ptr()))


def _digest(
    key: bytes, structure: output_structure.Structure, tensors: list[torch.Tensor], meta: dict
) -> str:
    h = hashlib.blake2b(key=key[:64], digest_size=32)
    described = [[dtype_name(t.dtype), list(t.shape)] for t in tensors]
    head = {
        "structure": structure,
        "tensors": described,
        "meta": {k: v for k, v in meta.items() if k != "mac"},
    }
    h.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
    for t in tensors:
        raw = _raw(t)
        if raw.numel():
            h.update(_bytes_of(raw))
    return h.hexdigest()


def verify(
    key: bytes, structure: output_structure.Structure, tensors: list[torch.Tensor], meta: dict
) -> bool:
    """Whether a loaded file carries the digest that `save(..., key=key)` wrote for this content."""
    mac = meta.get("mac")
    return isinstance(mac, str) and hmac.compare_digest(mac, _digest(key, structure, tensors, meta))


def mac_record(key: bytes, record: Mapping[str, Any]) -> dict[str, Any]:
    """The record with record["mac"]: a keyed digest of its JSON form."""
    body = {k: v for k, v in record.items() if k != "mac"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return {**body, "mac": hmac.new(key, text, hashlib.sha256).hexdigest()}


def verify_record(key: bytes, record: Mapping[str, Any]) -> bool:
    """Whether a record read back (JSON) still carries the digest `mac_record` gave it."""
    mac = record.get("mac") if isinstance(record, dict) else None
    return isinstance(mac, str) and hmac.compare_digest(mac, mac_record(key, record)["mac"])


def save(
    path: Path,
    tensors: list[torch.Tensor],
    structure: output_structure.Structure = "tuple",
    meta: dict | None = None,
    key: bytes | None = None,
) -> None:
    """Write tensors (any device) to `path` atomically; with `key`, meta["mac"] is their digest."""
    entries = []
    blobs = []
    offset = 0
    cpu = [t.detach().to("cpu").contiguous() for t in tensors]
    meta = dict(meta or {})
    if key is not None:
        meta["mac"] = _digest(key, structure, cpu, meta)
    for t in cpu:
        raw = _raw(t)
        entries.append(
            {"dtype": dtype_name(t.dtype), "shape": list(t.shape), "offset": offset, "nbytes": raw.numel()}
        )
        blobs.append(raw)
        offset += raw.numel()
    header = json.dumps({"structure": structure, "tensors": entries, "meta": meta}).encode()
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for raw in blobs:
            if raw.numel():
                f.write(_bytes_of(raw))
    os.replace(tmp, path)


def load(
    path: Path, max_bytes: int, max_tensors: int = MAX_TENSORS
) -> tuple[output_structure.Structure, list[torch.Tensor], dict[str, Any]]:
    """Read the tensor file at `path` (a file of this process's own making: the host reads a
    launch's files with `read`, from a descriptor the launch's doorway opened)."""
    with open(path, "rb") as f:
        return read(f, path.name, max_bytes, max_tensors)


@dataclass(frozen=True)
class Expected:
    """What one result file must hold, known before it is read (the reference's outputs of the same
    trial or input set): the structure, and each tensor's dtype name and shape, in order."""

    structure: output_structure.Structure
    tensors: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def of(cls, structure: output_structure.Structure, tensors: list[torch.Tensor]) -> Expected:
        return cls(structure, tuple((dtype_name(t.dtype), tuple(int(d) for d in t.shape)) for t in tensors))

    @property
    def data_bytes(self) -> int:
        """The bytes of its tensors' data."""
        return sum(math.prod(shape) * DTYPE_NAMES[dtype].itemsize for dtype, shape in self.tensors)

    @property
    def file_bytes(self) -> int:
        """The most a file holding these outputs takes: the data and the largest header allowed."""
        return len(MAGIC) + 8 + MAX_HEADER_BYTES + self.data_bytes


class Mismatch(str):
    """How a file's header first differs from its expected outputs, in the words of the host's judge
    (pkb_mcp/runs/judge.py): "output 0 is float32[8], expected float32[4]". A str, kept where a
    file's read error would be, so that the judge can tell it from one; `meta` is the header's own
    (its aliasing and mutation flags, which the judge names before any difference of shape)."""

    meta: dict[str, Any]

    def __new__(cls, difference: str, meta: dict[str, Any] | None = None) -> Mismatch:
        made = super().__new__(cls, difference)
        made.meta = meta or {}
        return made


class HeaderMismatch(TensorFileError):
    """The header describes other outputs than the expected ones (`difference` says how); no data
    was read."""

    def __init__(self, difference: str, meta: dict[str, Any] | None = None) -> None:
        super().__init__(difference)
        self.difference = Mismatch(difference, meta)


def read(
    f: BinaryIO,
    name: str,
    max_bytes: int,
    max_tensors: int = MAX_TENSORS,
    expect: Expected | None = None,
) -> tuple[output_structure.Structure, list[torch.Tensor], dict[str, Any]]:
    """Read a tensor file written by anyone from `f` (named `name` in messages), of at most
    `max_bytes` bytes of data and `max_tensors` tensors (at most HARD_MAX_TENSORS); returns
    (structure, tensors, meta) or raises TensorFileError. The header is read and checked first, and
    only the data its tensors take is read after it, each tensor straight into its own memory. With
    `expect`, a header that describes other outputs (structure, count, dtypes, shapes) raises
    HeaderMismatch before any data is read."""
    if f.read(len(MAGIC)) != MAGIC:
        raise TensorFileError(f"{name} is not a tensor file")
    head = f.read(8)
    if len(head) != 8:
        raise TensorFileError(f"{name} is not a tensor file")
    (hlen,) = struct.unpack("<Q", head)
    if hlen > MAX_HEADER_BYTES:
        raise TensorFileError(f"{name} has an oversized header")
    try:
        header = json.loads(f.read(hlen))
    except (ValueError, RecursionError) as exc:  # nesting too deep for the decoder
        raise TensorFileError(f"{name} has a malformed header") from exc
    if not isinstance(header, dict):
        raise TensorFileError(f"{name} has a malformed header")
    entries = header.get("tensors")
    if not isinstance(entries, list) or len(entries) > min(max_tensors, HARD_MAX_TENSORS):
        count = len(entries) if isinstance(entries, list) else "?"
        raise TensorFileError(
            f"{name} lists {count} tensors, over the cap of {min(max_tensors, HARD_MAX_TENSORS)} "
            "(a problem whose outputs are more raises it with MAX_OUTPUTS)"
        )
    structure = header.get("structure")
    try:
        expected = len(entries) if structure == "tuple" else output_structure.check(structure)
    except output_structure.StructureError as exc:
        raise TensorFileError(f"{name} has a malformed output structure: {exc}") from exc
    if expected != len(entries):
        raise TensorFileError(
            f"{name}: its structure holds {expected} tensors, its header lists {len(entries)}"
        )
    assert isinstance(structure, (str, list))  # output_structure.check accepted it
    described = _entries(entries, name)
    if expect is not None:
        difference = _difference(structure, described, expect)
        if difference is not None:
            said = header.get("meta")
            raise HeaderMismatch(difference, said if isinstance(said, dict) else {})
    end = described[-1][3] + described[-1][4] if described else 0
    if end > max_bytes:
        raise TensorFileError(f"{name} is over the cap of {max_bytes} bytes")
    tensors = [_read_tensor(f, name, dtype, shape, nbytes) for _, dtype, shape, _, nbytes in described]
    meta = header.get("meta")
    return structure, tensors, meta if isinstance(meta, dict) else {}


def _entries(entries: list, name: str) -> list[tuple[str, torch.dtype, list[int], int, int]]:
    """Each tensor entry of a header as (dtype name, dtype, shape, offset, bytes), checked: a known
    dtype, a shape whose size is its byte count, and the data laid out in order, each tensor right
    after the one before (as `save` writes it)."""
    described = []
    at = 0
    for e in entries:
        try:
            dtype = DTYPE_NAMES[e["dtype"]]
            shape = [int(s) for s in e["shape"]]
            offset, nbytes = int(e["offset"]), int(e["nbytes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TensorFileError(f"{name} has a malformed tensor entry") from exc
        if any(s < 0 for s in shape) or math.prod(shape) * dtype.itemsize != nbytes:
            raise TensorFileError(f"{name}: shape and byte count disagree")
        if offset != at:
            raise TensorFileError(f"{name}: tensor data is not laid out in order")
        described.append((e["dtype"], dtype, shape, offset, nbytes))
        at = offset + nbytes
    return described


def _difference(
    structure: output_structure.Structure,
    described: list[tuple[str, torch.dtype, list[int], int, int]],
    expect: Expected,
) -> str | None:
    """The first difference between a header and the expected outputs, worded as the judge words it
    (pkb_mcp/runs/judge.py); None when they agree."""
    want = output_structure.tree(expect.structure, len(expect.tensors))
    got = output_structure.tree(structure, len(described))
    found = output_structure.difference(got, want)
    if found is not None:
        return found
    if len(described) != len(expect.tensors):  # only a malformed expectation gets here
        return f"the output holds {len(described)} tensors, expected {len(expect.tensors)}"
    names = output_structure.tensor_names(want)
    for i, ((dtype, _, shape, _, _), (want_dtype, want_shape)) in enumerate(
        zip(described, expect.tensors, strict=True)
    ):
        if dtype != want_dtype or shape != list(want_shape):
            return f"{names[i]} is {dtype}{shape}, expected {want_dtype}{list(want_shape)}"
    return None


def _read_tensor(f: BinaryIO, name: str, dtype: torch.dtype, shape: list[int], nbytes: int) -> torch.Tensor:
    """The next `nbytes` of `f` as a tensor of `dtype` and `shape`, read into its own memory."""
    raw = torch.empty(nbytes, dtype=torch.uint8)
    if nbytes:
        view = _bytes_of(raw)
        got = 0
        while got < nbytes:
            n = f.readinto(view[got:])  # type: ignore[attr-defined]
            if not n:
                raise TensorFileError(f"{name}: tensor data runs past the end of the file")
            got += n
    return raw.view(dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype)

import json
import os
import struct

import pytest
import torch

from harness import tensorfile


def test_round_trip_keeps_dtype_shape_and_values(tmp_path):
    tensors = [
        torch.randn(3, 5, dtype=torch.bfloat16),
        torch.arange(7),
        torch.randn(4, dtype=torch.complex64),
        torch.empty(0, 2),
        torch.tensor(True),
    ]
    path = tmp_path / "a.pkbt"
    tensorfile.save(path, tensors, "tuple", {"note": 1})
    structure, loaded, meta = tensorfile.load(path, 1 << 20)
    assert structure == "tuple" and meta == {"note": 1}
    for a, b in zip(loaded, tensors, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _forge(path, header, data=b""):
    raw = json.dumps(header).encode()
    path.write_bytes(tensorfile.MAGIC + struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize(
    ("header", "data", "message"),
    [
        (
            {
                "structure": "tensor",
                "tensors": [{"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16}],
            },
            b"\0" * 8,
            "past the end",
        ),
        (
            {
                "structure": "tensor",
                "tensors": [{"dtype": "float32", "shape": [4], "offset": 0, "nbytes": 12}],
            },
            b"\0" * 16,
            "disagree",
        ),
        (
            {"structure": "tensor", "tensors": [{"dtype": "object", "shape": [1], "offset": 0, "nbytes": 8}]},
            b"\0" * 8,
            "malformed",
        ),
        ({"structure": "pickle", "tensors": []}, b"", "malformed"),
    ],
)
def test_forged_files_are_refused(tmp_path, header, data, message):
    path = tmp_path / "x.pkbt"
    _forge(path, header, data)
    with pytest.raises(tensorfile.TensorFileError, match=message):
        tensorfile.load(path, 1 << 20)


def test_size_cap_and_magic(tmp_path):
    path = tmp_path / "big.pkbt"
    tensorfile.save(path, [torch.zeros(1024)])
    with pytest.raises(tensorfile.TensorFileError, match="over the cap"):
        tensorfile.load(path, 100)
    path.write_bytes(b"\x80\x04pickle")
    with pytest.raises(tensorfile.TensorFileError, match="not a tensor file"):
        tensorfile.load(path, 1 << 20)


def test_fp8_outputs_round_trip_bit_exact_and_are_judged_as_values(tmp_path):
    from pkb_mcp.launches import Outputs
    from pkb_mcp.runs.judge import compare

    values = torch.linspace(-400, 400, 64 * 128).reshape(64, 128)
    codes = values.to(torch.float8_e4m3fn)
    path = tmp_path / "fp8.pkbt"
    tensorfile.save(path, [torch.rand(64), codes])
    _, loaded, _ = tensorfile.load(path, 1 << 20)
    assert loaded[1].dtype == torch.float8_e4m3fn
    assert torch.equal(loaded[1].view(torch.uint8), codes.view(torch.uint8))

    # the neighbouring code (sign-magnitude bits: one less is one step toward zero) passes a 1/8
    # relative tolerance; doubling a code does not
    want = Outputs("tuple", loaded, {})
    tol = {"atol": 2.0**-9, "rtol": 0.125, "rel_norm": 0.01}
    one_step = codes.view(torch.uint8).clone()
    one_step[3, 5] -= 1
    got = Outputs("tuple", [loaded[0], one_step.view(torch.float8_e4m3fn)], {})
    assert compare(0, 0, got, want, tol).state == "pass"
    doubled = codes.float()
    doubled[3, 5] *= 2
    got = Outputs("tuple", [loaded[0], doubled.to(torch.float8_e4m3fn)], {})
    assert compare(0, 0, got, want, tol).state == "wrong"


def test_result_files_carry_a_keyed_digest(tmp_path):
    """A file (or timing record) rewritten without the launch's key is told apart from the harness's."""
    key = tensorfile.result_key([11, 22])
    path = tmp_path / "t0_r0.pkbt"
    x = torch.randn(8, 4, dtype=torch.bfloat16)
    tensorfile.save(path, [x, torch.arange(3)], "tuple", {"aliased_outputs": [0]}, key=key)
    structure, loaded, meta = tensorfile.load(path, 1 << 20)
    assert tensorfile.verify(key, structure, loaded, meta)
    other = tensorfile.result_key([11, 23])  # another launch's key
    assert not tensorfile.verify(other, structure, loaded, meta)
    assert not tensorfile.verify(key, structure, loaded, {**meta, "aliased_outputs": []}), "flags changed"
    loaded[0][0, 0] += 1
    assert not tensorfile.verify(key, structure, loaded, meta), "values changed"
    tensorfile.save(path, [x], "tensor", {})  # rewritten without the key
    assert not tensorfile.verify(key, *tensorfile.load(path, 1 << 20))

    record = tensorfile.mac_record(key, {"device_ms": [0.25, 1e-7], "stop_reason": "sample cap"})
    read_back = json.loads(json.dumps(record))
    assert tensorfile.verify_record(key, read_back)
    assert not tensorfile.verify_record(key, {**read_back, "device_ms": [0.000123, 1e-7]})
    assert not tensorfile.verify_record(key, {"device_ms": [0.25]})


@pytest.mark.parametrize("mode, kept", [("outputs", 1.0), ("benchmark", 2.0)])
def test_a_job_collects_only_its_own_modes_result_files(tmp_path, mode, kept):
    """Trial files (t<n>) and timed-set files (s<n>) share numbers: a file of the other mode left in
    the launch directory must never stand in for one of this mode."""
    from pkb_mcp.launches import LaunchRequest, _collect

    out = tmp_path / "out"
    out.mkdir()
    tensorfile.save(out / "t0_r0.pkbt", [torch.full((4,), 1.0)], "tensor", {})
    tensorfile.save(out / "s0_r0.pkbt", [torch.full((4,), 2.0)], "tensor", {})
    settings = {"mode": mode, "world_size": 1, "device": "cpu", "size": {}, "dtype": "float32", "seeds": [1]}
    settings |= {
        "tolerance": {},
        "timeout_s": 10,
        "timing": None,
        "threads_per_rank": 1,
        "convention": "auto",
    }
    request = LaunchRequest(settings, tmp_path / "p.py", tmp_path / "p.py", gpus=[])
    outcome = _collect(tmp_path, request, "", killed=False, wall_s=0.0)
    assert list(outcome.outputs) == [(0, 0)]
    assert outcome.outputs[(0, 0)].tensors[0].eq(kept).all()


def test_the_tensor_count_cap_is_the_problems_up_to_the_hard_cap(tmp_path):
    path = tmp_path / "many.pkbt"
    tensorfile.save(path, [torch.ones(1)] * 70, ["tuple", [["tensor"]] * 70])
    with pytest.raises(tensorfile.TensorFileError, match="lists 70 tensors, over the cap of 64"):
        tensorfile.load(path, 1 << 20)
    structure, tensors, _ = tensorfile.load(path, 1 << 20, max_tensors=80)
    assert len(tensors) == 70 and structure[1][69] == ["tensor"]
    tensorfile.save(path, [torch.ones(1)] * (tensorfile.HARD_MAX_TENSORS + 1))
    with pytest.raises(tensorfile.TensorFileError, match="over the cap of 1024"):
        tensorfile.load(path, 1 << 20, max_tensors=10_000)


class CountingReader:
    """A binary file that counts the bytes taken from it."""

    def __init__(self, f):
        self.f, self.taken = f, 0

    def read(self, n=-1):
        data = self.f.read(n)
        self.taken += len(data)
        return data

    def readinto(self, buffer):
        n = self.f.readinto(buffer)
        self.taken += n
        return n


def _header_bytes(header):
    raw = json.dumps(header).encode()
    return tensorfile.MAGIC + struct.pack("<Q", len(raw)) + raw


EXPECT_4 = tensorfile.Expected("tensor", (("float32", (4,)),))


@pytest.mark.parametrize("sparse_data", [False, True], ids=["data absent", "1 GiB of sparse data"])
def test_a_wrong_shape_is_refused_from_the_header_before_any_data_is_read(tmp_path, sparse_data):
    """Four wrong-shape 1 GiB outputs took the host to 7.7 GB: each was read whole before its shape
    was compared. Now the header is compared with the expected outputs first."""
    huge = 1 << 28  # float32 elements: 1 GiB
    head = _header_bytes(
        {
            "structure": "tensor",
            "tensors": [{"dtype": "float32", "shape": [huge], "offset": 0, "nbytes": 4 * huge}],
        }
    )
    path = tmp_path / "t0_r0.pkbt"
    path.write_bytes(head)
    if sparse_data:
        os.truncate(path, len(head) + 4 * huge)  # a hole: costs the disk nothing
    with open(path, "rb") as raw:
        f = CountingReader(raw)
        with pytest.raises(tensorfile.HeaderMismatch) as caught:
            tensorfile.read(f, path.name, 8 << 30, expect=EXPECT_4)
    assert str(caught.value) == f"output 0 is float32[{huge}], expected float32[4]", "the judge's words"
    assert isinstance(caught.value.difference, tensorfile.Mismatch)
    assert f.taken == len(head), "only the header was read"


def test_a_header_that_matches_is_read_in_full_and_other_differences_are_named(tmp_path):
    path = tmp_path / "ok.pkbt"
    tensorfile.save(path, [torch.arange(4.0)], "tensor")
    with open(path, "rb") as f:
        _, tensors, _ = tensorfile.read(f, path.name, 1 << 20, expect=EXPECT_4)
    assert torch.equal(tensors[0], torch.arange(4.0))
    tensorfile.save(path, [torch.arange(4.0), torch.ones(2)], "tuple")
    with (
        open(path, "rb") as f,
        pytest.raises(tensorfile.HeaderMismatch, match="expected tensor, got a tuple"),
    ):
        tensorfile.read(f, path.name, 1 << 20, expect=EXPECT_4)
    tensorfile.save(path, [torch.arange(4, dtype=torch.float64)], "tensor")
    with (
        open(path, "rb") as f,
        pytest.raises(tensorfile.HeaderMismatch, match=r"float64\[4\], expected float32\[4\]"),
    ):
        tensorfile.read(f, path.name, 1 << 20, expect=EXPECT_4)
    assert EXPECT_4.data_bytes == 16 and EXPECT_4.file_bytes == 16 + tensorfile.MAX_HEADER_BYTES + 14

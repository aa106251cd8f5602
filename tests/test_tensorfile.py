import json
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

"""The context a problem's `make_inputs` and `traffic` receive.

Imports torch and the standard library only: problems and the harness run in any image.
Random helpers draw from a generator seeded per rank (or shared by all ranks), on the
rank's device, so that inputs are never built on the host and copied; on the `meta`
device they return shape-only tensors, which is how the host learns input shapes
without allocating anything.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
    "int64": torch.int64,
    "int32": torch.int32,
}


def derive_seed(base: int, *parts: object) -> int:
    """A 63-bit seed from a base seed and labels (rank, purpose); stable across processes."""
    text = ":".join([str(base), *(str(p) for p in parts)]).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


@dataclass
class ProblemContext:
    """Everything a problem needs to build one rank's inputs or state its traffic."""

    rank: int
    world_size: int
    size: dict[str, Any]
    dtype: torch.dtype = torch.bfloat16
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0
    _generators: dict[str, torch.Generator] = field(default_factory=dict, repr=False)

    @property
    def is_meta(self) -> bool:
        return self.device.type == "meta"

    def _generator(self, shared: bool) -> torch.Generator | None:
        if self.is_meta:
            return None
        key = "shared" if shared else "rank"
        if key not in self._generators:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(derive_seed(self.seed, key if shared else f"rank{self.rank}"))
            self._generators[key] = gen
        return self._generators[key]

    def randn(
        self, *shape: int, dtype: torch.dtype | None = None, shared: bool = False, scale: float = 1.0
    ) -> torch.Tensor:
        """Standard normal values (times `scale`); `shared=True` gives every rank the same tensor.
        A complex dtype draws its real and imaginary parts independently, each standard normal."""
        dtype = dtype or self.dtype
        if self.is_meta:
            return torch.empty(*shape, dtype=dtype, device="meta")
        if dtype.is_complex:
            return self._complex(
                dtype, lambda s: self.randn(*s, dtype=dtype.to_real(), shared=shared, scale=scale), shape
            )
        work = dtype if dtype.is_floating_point and dtype.itemsize >= 2 else torch.float32
        out = torch.randn(*shape, generator=self._generator(shared), device=self.device, dtype=work)
        if scale != 1.0:
            out.mul_(scale)
        return out.to(dtype)

    def rand(
        self,
        *shape: int,
        low: float = 0.0,
        high: float = 1.0,
        dtype: torch.dtype | None = None,
        shared: bool = False,
    ) -> torch.Tensor:
        """Uniform values in [low, high); a complex dtype draws its real and imaginary parts
        independently, each uniform in [low, high)."""
        dtype = dtype or self.dtype
        if self.is_meta:
            return torch.empty(*shape, dtype=dtype, device="meta")
        if dtype.is_complex:
            real = dtype.to_real()
            return self._complex(
                dtype, lambda s: self.rand(*s, low=low, high=high, dtype=real, shared=shared), shape
            )
        out = torch.rand(*shape, generator=self._generator(shared), device=self.device, dtype=torch.float32)
        return (out * (high - low) + low).to(dtype)

    @staticmethod
    def _complex(
        dtype: torch.dtype, draw: Callable[[tuple[int, ...]], torch.Tensor], shape: tuple[int, ...]
    ) -> torch.Tensor:
        # one draw of (*shape, 2) real values, read as (real, imaginary) pairs
        return torch.view_as_complex(draw((*shape, 2)).contiguous()).to(dtype)

    def full(self, shape: tuple[int, ...], value: float, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A constant tensor (the original benchmark's inputs of its primitives, `problems/original/`)."""
        dtype = dtype or self.dtype
        if self.is_meta:
            return torch.empty(shape, dtype=dtype, device="meta")  # the tuple, so () is 0-dim
        return torch.full(shape, value, dtype=dtype, device=self.device)

    def randint(self, low: int, high: int, *shape: int, shared: bool = False) -> torch.Tensor:
        """Integers in [low, high), int64."""
        if self.is_meta:
            return torch.empty(*shape, dtype=torch.int64, device="meta")
        return torch.randint(low, high, shape, generator=self._generator(shared), device=self.device)

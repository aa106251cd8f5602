"""`compile_cuda_extension`, the helper that original-benchmark solution files build their CUDA with.

A file passes one CUDA source that carries its own `PYBIND11_MODULE` bindings:

    _ext = compile_cuda_extension("my_ext", CUDA_SRC)

This builds it as `load_inline(name, cpp_sources="", cuda_sources=CUDA_SRC)` would, through the same
path as any `load_inline` call in a launch: built once per node by a build launch and loaded from the
extension cache (harness/extensions.py). Stdlib + torch only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

DEFAULT_CUDA_FLAGS = ("-O3",)


def compile_cuda_extension(
    name: str,
    cuda_src: str,
    extra_cuda_cflags: Sequence[str] | None = None,
    extra_cflags: Sequence[str] | None = None,
    extra_ldflags: Sequence[str] | None = None,
    verbose: bool = False,
) -> Any:
    """Build (or load from the cache) the extension `name` from one CUDA source with its own bindings."""
    from torch.utils import cpp_extension  # looked up per call: the launch routes it through the cache

    return cpp_extension.load_inline(
        name=name,
        cpp_sources="",
        cuda_sources=cuda_src,
        extra_cuda_cflags=[*DEFAULT_CUDA_FLAGS, *(extra_cuda_cflags or [])],
        extra_cflags=list(extra_cflags or []),
        extra_ldflags=list(extra_ldflags or []),
        verbose=verbose,
    )

"""All-reduces in place and returns its input (no allocation), and hides that from the judge by
wrapping harness.tensorfile.save so the aliasing and mutation flags are never written.

Expected: fail, every rank `error` ("replaced harness.tensorfile.save").
"""

import sys

import torch.distributed as dist


def _install():
    tensorfile = sys.modules["harness.tensorfile"]
    real = tensorfile.save
    if getattr(real, "_forged", False):
        return

    def save(path, tensors, structure="tuple", meta=None, **kwargs):
        meta = dict(meta or {})
        meta.pop("aliased_outputs", None)
        meta.pop("mutated_inputs", None)
        return real(path, tensors, structure, meta, **kwargs)

    save._forged = True
    tensorfile.save = save


def solution(x):
    _install()
    dist.all_reduce(x)
    return x

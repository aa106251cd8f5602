"""Crashes the interpreter with SIGSEGV on rank 0."""

import ctypes

import torch.distributed as dist


def solution(*args):
    if dist.get_rank() == 0:
        ctypes.string_at(0)
    out = args[0].clone()
    dist.all_reduce(out)
    return out

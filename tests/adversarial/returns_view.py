"""For problem 3 (broadcast): the root returns a view of its own input instead of a new tensor.

The values are right (the root's output equals its input) and nothing is mutated: only the alias
check catches it. A caller that later writes its input would silently change "the output".
Expected: fail, rank 0 `wrong` ("shares memory with an input"), the other ranks pass.
"""

import torch
import torch.distributed as dist


def solution(x):
    if dist.get_rank() == 0:
        dist.broadcast(x, src=0)  # sends x as it is: reads only
        return x.view(x.shape)
    out = torch.empty_like(x)
    dist.broadcast(out, src=0)
    return out

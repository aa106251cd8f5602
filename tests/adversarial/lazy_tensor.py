"""Returns a tensor subclass that does the all-reduce lazily, at the harness's first touch.

`solution` only clones its input and returns it as a LazyTensor; the all-reduce waits in a queue
until some torch function or attribute is first used on any LazyTensor, which the harness did only
after the call had returned: after the clock stopped, so every judged and timed output came out
right and the benchmark credited 65.8x. Expected: check and bench fail: outputs must be plain
tensors, taken at return inside the call ("output 0 is a LazyTensor, a subclass of torch.Tensor;
return plain tensors").
"""

import torch
import torch.distributed as dist

_pending = []


class LazyTensor(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        while _pending:  # the deferred work, on whatever touches a LazyTensor first
            with torch._C.DisableTorchFunctionSubclass():
                dist.all_reduce(_pending.pop().as_subclass(torch.Tensor))
        return super().__torch_function__(func, types, args, kwargs or {})


def solution(x):
    out = x.clone()
    _pending.append(out)
    return out.as_subclass(LazyTensor)

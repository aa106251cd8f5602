"""On CPU, the all-gathers NCCL takes and gloo refuses, done as NCCL does them.

The original benchmark's files (the `original` variant, docs/variants.md) were written for NCCL, and
two of its calls are refused by gloo, the CPU ranks' backend:

- `all_gather_into_tensor` whose output is not the input's shape stacked along its first dimension:
  a 0-dim input gathered into [W] (61's counts), an input [r, c] gathered into [W, r, c]. NCCL needs
  only W times the input's elements, in rank order; gloo wants [W * r, c].
- `all_gather` into a list of tensors of unequal sizes, each rank's own (81's variable gather). NCCL
  gathers each; gloo wants one size.

`install()` (the worker, once its gloo group is up) wraps torch.distributed's two functions, for the
reference and the candidate alike: a call gloo takes goes to gloo unchanged; one of the shapes above
is done with gloo's own all-gather of flat, equal-sized buffers, the result the same as NCCL's. The
candidate's code is never touched. Imports only torch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_gloo_all_gather_into_tensor = dist.all_gather_into_tensor
_gloo_all_gather = dist.all_gather


class _Done:
    """The work of an async_op call the shim completed before returning."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def all_gather_into_tensor(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    stacked = input_tensor.dim() > 0 and output_tensor.shape[1:] == input_tensor.shape[1:]
    world = dist.get_world_size(group)
    if stacked or not output_tensor.is_contiguous() or output_tensor.numel() != world * input_tensor.numel():
        return _gloo_all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
    # flat, both: gloo gathers W equal chunks of the input's elements, in rank order, as NCCL does
    return _gloo_all_gather_into_tensor(
        output_tensor.view(-1), input_tensor.reshape(-1), group=group, async_op=async_op
    )


def all_gather(
    tensor_list: list[torch.Tensor], tensor: torch.Tensor, group: Any = None, async_op: bool = False
) -> Any:
    if len({t.shape for t in tensor_list}) <= 1:
        return _gloo_all_gather(tensor_list, tensor, group=group, async_op=async_op)
    most = max(t.numel() for t in tensor_list)
    sent = tensor.new_zeros(most)
    sent[: tensor.numel()] = tensor.reshape(-1)
    received = [tensor.new_empty(most) for _ in tensor_list]
    _gloo_all_gather(received, sent, group=group)
    for out, got in zip(tensor_list, received, strict=True):
        out.copy_(got[: out.numel()].view(out.shape))
    return _Done() if async_op else None


def install() -> None:
    """torch.distributed's all-gathers as NCCL takes them, over gloo (see the module's docstring)."""
    for module in (dist, dist.distributed_c10d):
        module.all_gather_into_tensor = all_gather_into_tensor  # type: ignore[assignment,attr-defined]
        module.all_gather = all_gather  # type: ignore[assignment,attr-defined]

# Problem 8 written the original benchmark's way: it hangs. Rank 0 waits for a message that no rank
# ever sends; the job's deadline ends it, and the batch goes on.
import torch
import torch.distributed as dist


def solution(tensor: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(tensor)
    if dist.get_rank() == 0:
        dist.recv(out, src=1)
    dist.all_to_all_single(out, tensor)
    return out

"""Problem 27 without the exchange: the output's shape, filled from this rank's own rows. It must fail
(wrong, not crashed): the rows are random per rank."""


def solution(local_tensor, input_split_sizes=None, output_split_sizes=None, group=None):
    rows = sum(output_split_sizes)
    return local_tensor.repeat(rows // local_tensor.shape[0] + 1, 1)[:rows].clone()

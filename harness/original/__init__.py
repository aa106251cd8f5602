"""What solution files written for the original ParallelKernelBench import from its repository.

The folder is put on a candidate's `sys.path` (harness/worker.py, harness/discover.py), so that
`from utils.cuda_helpers import compile_cuda_extension` works unchanged. Stdlib + torch only.
"""

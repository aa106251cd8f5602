"""The in-sandbox side of pkb: rank launcher, rank worker, inputs, timing and the safe tensor file.

Everything here imports only torch and the standard library (harness.launch: the standard library
alone), so it runs in any image that has Python and PyTorch.
"""

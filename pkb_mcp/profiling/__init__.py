"""The profile verb: `profile` runs both sides under torch.profiler in the sandbox (and, where it can, a
counter launch under Nsight Compute), `traces` reads their untrusted per-rank traces into figures and
one merged trace, `nvlink` and `ncu_csv` turn counters into NVLink bytes per kernel and rank,
`timeline` draws its PNG."""

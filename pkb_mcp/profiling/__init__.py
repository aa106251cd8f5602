"""The profile verb: `profile` runs both sides under torch.profiler in the sandbox, `traces` reads their
untrusted per-rank traces into figures and one merged trace, `timeline` draws its PNG."""

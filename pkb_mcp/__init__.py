"""pkb-mcp, host side: multi-GPU kernel problems behind one service, for agents (MCP) and people (CLI).

Everything in this package runs outside the sandbox and trusts nothing the sandbox writes.

- Entry points: `cli` (the `pkb` command) and `server` (the MCP server, `pkb serve`), each a thin
  layer over `service`, one function per verb, which returns the result models of `models`.
- Long work: `scheduler` queues the MCP server's jobs onto the node's GPUs, with progress, deadlines and
  cancellation, and `store` keeps their state in SQLite.
- Running candidate code: `launches` runs one launch (all its ranks) through a sandbox backend (`sandbox/`),
  with the rank launcher and workers of `harness/` inside.
- Judging and figures: `judge` compares outputs with the reference's, `stats` turns timing samples into
  medians and speedups, `roofline` gives the floor from a problem's traffic and the node's ceilings
  (docs/measurement.md defines every figure); `profile` is the profile verb, `traces` reads its
  untrusted per-rank traces into figures and the merged trace, `timeline` draws its PNG.
- Builds: the `compile` package (nvcc for sm_90a, ptxas resources, a content-keyed cache) and
  `extensions` (the node's cache of `load_inline` extensions, built once, read-only to every job).
- Around them: `problems` (the suite), `static_report` (what a source calls, read without importing
  it), `render` (text for the CLI and the MCP `content`), `config`, `errors`, `log`, `httpauth`.

It may import `harness` (shared formats: tensor files, input context, timing records, extension keys)
and `sandbox`, never candidate code.
"""

__version__ = "0.1.0"

"""pkb-mcp, host side: multi-GPU kernel problems behind one service, for agents (MCP) and people (CLI).

Everything in this package runs outside the sandbox and trusts nothing the sandbox writes.

Its packages, from the front ends down (each imports only those below it; docs/architecture.md,
"Packages", is the table that tests/test_import_graph.py checks):

- `frontends`: the `pkb` command (`cli`), the MCP server (`server`), their text (`render`), `httpauth`.
- `evaluation`: `pkb eval`, a batch of solution files run as jobs, with its store and reports.
- `jobs`: the scheduler in front of the node's GPUs, the job store, and jobs on a Ray cluster.
- `service` (a module): one function per verb, and `VERBS`, the table of the verbs that run as jobs.
- `profiling`: the profile verb, its traces and timeline.
- `runs`: a run's set-up, the benchmark, judging, verdicts and statistics.
- `compile`: nvcc builds and their diagnostics, and the node's cache of `load_inline` extensions.
- the root modules: `models` (`RunRequest`, the one request every run verb takes, and the results),
  `launches` (one launch of a problem's ranks through a sandbox backend), `problems`, `catalogue`
  (the problems listed from their files' text), `roofline`, `sqlite_file`, `config`, `errors`, `log`.

It may import `harness` (shared formats: tensor files, input context, timing records, extension keys)
and `sandbox`, never candidate code.
"""

__version__ = "0.1.0"

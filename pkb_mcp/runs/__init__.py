"""Running and judging candidate code: `run` sets up one run (the solution read as text, its backend,
its extensions built), `benchmark` times both sides, `judge` compares outputs, `verdicts` turns a
launch's records into per-rank results, `stats` turns timing samples into figures, `conventions` calls
files written for the original benchmark, `static_report` says what a source calls (read as text)."""

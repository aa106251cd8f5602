"""Batch evaluation (`pkb eval`): `evaluate` finds solution files and runs them as jobs, `store` keeps
each file's result in SQLite so a re-run does only what is left, `report` writes the reports."""

"""Agent evaluations: a coding agent's attempts at problems, judged by pkb (docs/agents.md)."""

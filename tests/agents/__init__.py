"""Real agent clients (Claude Code, Codex) against loopback stand-ins for their model APIs."""

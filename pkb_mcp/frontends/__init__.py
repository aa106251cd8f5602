"""The front ends: the `pkb` command (`cli`), the MCP server (`server`), the text both print (`render`)
and the HTTP transport's bearer token (`httpauth`). Each is a thin layer over `pkb_mcp.service` and the
job scheduler; nothing below imports this package."""

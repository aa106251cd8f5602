"""pkb-mcp: multi-GPU kernel problems behind one interface (CLI now, MCP server next).

Host side: everything here runs outside the sandbox and trusts nothing the sandbox writes.
"""

__version__ = "0.1.0"

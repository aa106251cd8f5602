"""`python -m pkb_mcp`: the `pkb` command."""

from pkb_mcp.frontends.cli import main

raise SystemExit(main())

"""The MCP face: the server, its tools, its wire contract; the only code that imports `mcp`."""

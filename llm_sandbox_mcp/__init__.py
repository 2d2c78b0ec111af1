"""llm-sandbox-mcp: run the code an AI agent writes in a hardened sandbox, over MCP."""

__version__ = "0.2.0"

__all__ = ("__version__",)

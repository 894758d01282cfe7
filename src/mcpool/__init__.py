"""mcpool: one daemon that shares MCP servers between sessions."""

__version__ = "0.1.0"

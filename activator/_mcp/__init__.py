"""The MCP control plane: agents create, use and delete sandboxes through five tools at `/mcp`."""

from activator._mcp._sandbox import SandboxUrls
from activator._mcp._server import McpServer

__all__ = ["McpServer", "SandboxUrls"]

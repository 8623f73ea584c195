"""The MCP control plane at `/mcp`: agents create, use and delete sandboxes, and delegate tasks to coding agents in
them."""

from activator._mcp._sandbox import SandboxUrls
from activator._mcp._server import McpServer

__all__ = ["McpServer", "SandboxUrls"]

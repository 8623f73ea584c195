"""The MCP control plane at `/mcp`: agents create, use and delete sandboxes, and delegate tasks to coding agents in
them."""

from activator._mcp._agent_port import CREATE_DEADLINE, AgentPort, session_path
from activator._mcp._browser import current_page, navigate
from activator._mcp._desktop import DESKTOP_VIEW_COMMAND
from activator._mcp._errors import AgentRefused, ToolError
from activator._mcp._sandbox import SandboxUrls
from activator._mcp._server import McpServer

__all__ = [
    "CREATE_DEADLINE",
    "DESKTOP_VIEW_COMMAND",
    "AgentPort",
    "AgentRefused",
    "McpServer",
    "SandboxUrls",
    "ToolError",
    "current_page",
    "navigate",
    "session_path",
]

"""E2B's `mcp-gateway` command for the `mcp-gateway` template: MCP servers behind one endpoint on port 50005.

`Sandbox.create(mcp={...})` runs `mcp-gateway --config '<json>'` as root with `GATEWAY_ACCESS_TOKEN` and
waits for it to exit. The command checks the configuration against the servers this template has
(`_catalog`), writes the token to `/etc/mcp-gateway/.token`, starts the gateway in the background and
exits 0 once it listens, or 1 with the reason on stderr, which the SDK raises. The gateway (`_gateway`) runs
each configured server over stdio and serves the union of their tools over streamable HTTP at `/mcp`,
to requests bearing the token. Unlike the rest of the executor it needs the template's venv (the `mcp`
package); nothing outside this subpackage imports it. See docs/mcp-gateway.md.
"""

from executor.mcp_gateway._main import main

__all__ = ("main",)

"""The `agent-sandbox` command: serve, manage API keys, build images, check the machine, deploy an app.

It sits above every other package (`cli → gateway → activator → pool`): the server's own code never imports it.
"""

from cli._main import main

__all__ = ["main"]

"""`python -m cli` runs the `agent-sandbox` command."""

from cli import main

main()

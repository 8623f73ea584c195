"""The coding-agent server of a sandbox (port `agent_api.AGENT_PORT`): sandbox-agent's API over real agent CLIs.

`_app` routes; `_acp_*` run agents and carry ACP over HTTP; `_sessions` keeps the universal sessions and
their logs (`executor.event_log`), normalised by `_normalise`; `_catalog` knows the agents; `mock` is the builtin
agent. Imported only when the first request for the agent port arrives.
"""

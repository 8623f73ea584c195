"""Universal sessions: an agent behind ACP, driven by messages, its events in a durable log.

Each session lives in `<state>/sessions/<id>/`: `session.json` (what it was created with, the
agent's native session id, whether it ended), `env.json` (the variables it gives its agent, mode
0600, never logged) and `events.jsonl` (the `EventLog` of `UniversalEvent`s). The log outlives the
agent process, pauses, snapshots and executor restarts; a message to a session whose agent has
exited starts the agent again, with `session/load` of the native session where the agent offers it.

One turn at a time (`TurnActive` otherwise). A permission request waits for a reply at most the
session's `permissionTimeoutMs`, then takes its `permissionDefault`; a cancelled turn, a terminate or
the agent's exit resolves it too, so nothing is left hanging.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from datetime import UTC, datetime
from typing import Any

import msgspec

from executor._agents._acp_hub import AcpHub
from executor._agents._acp_server import AcpServer, AgentExited
from executor._agents._normalise import Normaliser
from executor._process_env import working_directory
from executor._users import lookup
from executor.agent_api import CreateSessionRequest, SessionInfo, UniversalEvent
from executor.event_log import EventLog

__all__ = (
    "MAX_TURN_SECONDS",
    "Session",
    "SessionExists",
    "SessionRecord",
    "SessionTerminated",
    "Sessions",
    "TurnActive",
    "UnknownPermission",
)

logger = logging.getLogger("executor")

MAX_TURN_SECONDS = 6 * 3600.0
"""The longest one prompt may run before it is given up (a turn that hangs must end some day)."""
SETUP_SECONDS = 120.0
"""initialize, session/new or session/load: as long as an ACP POST may wait."""
_REPLY_KINDS = {
    "once": ("allow_once", "allow_always"),
    "always": ("allow_always", "allow_once"),
    "reject": ("reject_once", "reject_always"),
}
_STATUS = {"once": "accept", "always": "accept_for_session", "reject": "reject"}
_encoder = msgspec.json.Encoder()


class TurnActive(Exception):
    """A turn is running: one at a time."""


class SessionTerminated(Exception):
    """The session was terminated; it takes no more messages."""


class UnknownPermission(Exception):
    """No pending permission request has this id."""


class SessionRecord(msgspec.Struct):
    """`session.json`."""

    session_id: str
    created_at: str
    options: CreateSessionRequest
    native_session_id: str | None = None
    ended: bool = False


class _Pending(msgspec.Struct):
    permission_id: str
    request_id: Any
    action: str
    options: list[dict[str, Any]]
    timer: asyncio.TimerHandle | None = None


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class Session:
    """One session; its methods are called from the event loop only."""

    def __init__(self, hub: AcpHub, directory: str, record: SessionRecord, env: dict[str, str]) -> None:
        self._hub = hub
        self._directory = directory
        self.record = record
        self._env = env
        self.log = EventLog(os.path.join(directory, "events.jsonl"))
        self._normaliser = Normaliser()
        self._permissions = 0
        self._server: AcpServer | None = None
        self._next_id = 0
        self._loading = False
        self._turn: asyncio.Task[None] | None = None
        self._pending: dict[str, _Pending] = {}
        self._terminating = False
        self._stopping = False
        self._exit_reported = False
        self._lock = asyncio.Lock()

    @property
    def server_id(self) -> str:
        return f"session-{self.record.session_id}"

    @property
    def turn_active(self) -> bool:
        return self._turn is not None and not self._turn.done()

    def info(self) -> SessionInfo:
        options = self.record.options
        return SessionInfo(
            session_id=self.record.session_id,
            agent=options.agent,
            created_at=self.record.created_at,
            ended=self.record.ended,
            event_count=len(self.log),
            agent_mode=options.agent_mode,
            permission_mode=options.permission_mode,
            model=options.model,
            title=options.title,
            directory=options.directory,
            native_session_id=self.record.native_session_id,
            turn_active=self.turn_active,
            pending_permissions=list(self._pending),
        )

    # The life of the agent behind the session.

    async def start(self) -> None:
        """`session.started`, then the agent and its native session (what it says while it sets up comes after)."""
        self.emit("session.started", {"agent": self.record.options.agent}, source="daemon", synthetic=True)
        await self._ensure_agent()

    async def _ensure_agent(self) -> AcpServer:
        async with self._lock:
            if self._terminating:  # never a new agent for a session that is ending
                raise SessionTerminated("session terminated")
            if self._server is not None and not self._server.exited:
                return self._server
            if self._server is not None:
                await self._hub.close(self.server_id)
            options = self.record.options
            server = self._hub.open(self.server_id, options.agent, env=self._env, directory=options.directory)
            server.listeners.append(self._on_agent)
            self._server, self._exit_reported = server, False
            try:
                await self._set_up(server)
            except BaseException:
                await self._hub.close(self.server_id)
                self._server = None
                raise
            return server

    async def _set_up(self, server: AcpServer) -> None:
        options = self.record.options
        hello = await self._call(server, "initialize", {"protocolVersion": 1, "clientCapabilities": {}}, SETUP_SECONDS)
        cwd = self._cwd()
        can_load = bool((hello.get("agentCapabilities") or {}).get("loadSession"))
        native = self.record.native_session_id
        if native is not None and can_load:
            self._loading = True  # the agent replays the history as updates: it is in the log already
            try:
                await self._call(
                    server, "session/load", {"sessionId": native, "cwd": cwd, "mcpServers": []}, SETUP_SECONDS
                )
            finally:
                self._loading = False
            return
        created = await self._call(server, "session/new", {"cwd": cwd, "mcpServers": []}, SETUP_SECONDS)
        if native is not None:
            label = "the agent does not load old sessions: a new native session continues this one"
            self._status("agent_restarted", {"previous_native_session_id": native, "detail": label})
        self.record.native_session_id = str(created.get("sessionId", ""))
        self._save()
        for mode in (options.agent_mode, options.permission_mode):
            if mode:
                await self._call(
                    server,
                    "session/set_mode",
                    {"sessionId": self.record.native_session_id, "modeId": mode},
                    SETUP_SECONDS,
                )
        if options.model:
            params = {"sessionId": self.record.native_session_id, "configId": "model", "value": options.model}
            await self._call(server, "session/set_config_option", params, SETUP_SECONDS)

    def _cwd(self) -> str:
        """The agent's working directory as the launcher starts it there (envd's rules: relative to the home)."""
        defaults = self._hub.launcher.defaults
        return working_directory(defaults, lookup(defaults.user), self.record.options.directory)

    async def _call(self, server: AcpServer, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:  # noqa: ASYNC109
        self._next_id += 1
        message = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params}
        answer = json.loads(await server.request(message, timeout))
        if "error" in answer:
            error = answer["error"] or {}
            raise AgentError(method, error)
        result = answer.get("result")
        return result if isinstance(result, dict) else {}

    # Turns.

    async def send(self, text: str) -> None:
        """Start a turn with this message; it runs on in the background."""
        if self.record.ended or self._terminating:
            raise SessionTerminated("session terminated")
        if self.turn_active:
            raise TurnActive("a turn is already running in this session: wait for turn.ended, or cancel it")
        self._turn = asyncio.get_running_loop().create_task(self._run_turn(text))
        await asyncio.sleep(0)  # the turn's first events are logged before the caller answers

    async def _run_turn(self, text: str) -> None:
        self.emit("turn.started", {"phase": "started"}, source="daemon", synthetic=True)
        for kind, data in self._normaliser.user_message(text):
            self.emit(kind, data, source="daemon", synthetic=True)
        ended: dict[str, Any] = {"phase": "completed"}
        try:
            server = await self._ensure_agent()
            params = {"sessionId": self.record.native_session_id, "prompt": [{"type": "text", "text": text}]}
            result = await self._call(server, "session/prompt", params, MAX_TURN_SECONDS)
            ended["stop_reason"] = result.get("stopReason")
            if result.get("usage"):
                ended["usage"] = result["usage"]
            if result.get("stopReason") == "cancelled":
                ended["phase"] = "cancelled"
        except AgentError as exc:
            self.emit("error", {"message": exc.message, "code": "agent_error", "details": exc.error})
            ended["phase"] = "failed"
        except (AgentExited, ConnectionError) as exc:
            if self._stopping:
                message = {"message": "the agent server stopped during this turn", "code": "interrupted"}
                self.emit("error", message, source="daemon")
            elif not self._terminating:
                self._report_exit(str(exc))
            ended["phase"] = "interrupted" if self._stopping else "cancelled" if self._terminating else "failed"
        except TimeoutError:
            self.emit(
                "error", {"message": f"the turn ran past {MAX_TURN_SECONDS:.0f} s", "code": "timeout"}, source="daemon"
            )
            ended["phase"] = "failed"
        except SessionTerminated:  # terminated before the agent was (re)started
            ended["phase"] = "interrupted" if self._stopping else "cancelled"
        except Exception as exc:  # the agent could not be started again, e.g. it was uninstalled
            self.emit("error", {"message": str(exc), "code": "agent_not_available"}, source="daemon")
            ended["phase"] = "failed"
        for kind, data in self._normaliser.close_open():
            self.emit(kind, data)
        await self._resolve_all("turn_ended")
        self.emit("turn.ended", ended, source="daemon", synthetic=True)

    async def cancel(self) -> None:
        """Ask the agent to stop the running turn (`session/cancel`); its pending permissions are cancelled."""
        await self._resolve_all("cancelled")
        if self._server is not None and not self._server.exited:
            with contextlib.suppress(AgentExited, ConnectionError):
                await self._server.notify(
                    {
                        "jsonrpc": "2.0",
                        "method": "session/cancel",
                        "params": {"sessionId": self.record.native_session_id},
                    }
                )

    async def terminate(self) -> None:
        """End the session: cancel, stop the agent and its process group, `session.ended`. Idempotent."""
        if self.record.ended:
            return
        self._terminating = True
        await self.cancel()
        await self._hub.close(self.server_id)
        if self._turn is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._turn), 1.0)
        self.emit("session.ended", {"reason": "terminated", "terminated_by": "daemon"}, source="daemon", synthetic=True)
        self.record.ended = True
        self._save()
        self.log.close()

    async def close(self) -> None:
        """The executor stops: end the agent, keep the session (a restarted executor resumes it)."""
        self._terminating = self._stopping = True
        await self._hub.close(self.server_id)
        if self._turn is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._turn), 1.0)

    # What the agent says.

    def _on_agent(self, message: dict[str, Any]) -> None:
        method = message.get("method")
        if method == "session/update" and not self._loading:
            params = message.get("params")
            update = params.get("update") if isinstance(params, dict) else None
            if not isinstance(update, dict):
                self.emit(
                    "agent.unparsed", {"error": "a session/update without an update object", "location": "params"}
                )
                return
            for kind, data in self._normaliser.update(update):
                self.emit(kind, data)
        elif method == "session/request_permission" and "id" in message:
            self._permission_requested(message)
        elif method == "_adapter/agent_exited":
            asyncio.get_running_loop().create_task(self._agent_exited(message.get("params") or {}))
        elif method is not None and "id" in message:  # a request we did not offer (fs, terminal): refuse it
            error = {"code": -32601, "message": f"method not supported by this client: {method}"}
            asyncio.get_running_loop().create_task(self._answer(message["id"], error=error))

    async def _answer(self, request_id: Any, result: Any = None, error: Any = None) -> None:
        if self._server is None or self._server.exited:
            return
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id}
        reply |= {"error": error} if error is not None else {"result": result}
        with contextlib.suppress(AgentExited, ConnectionError):
            await self._server.notify(reply)

    async def _agent_exited(self, params: dict[str, Any]) -> None:
        await self._resolve_all("agent_exited")
        if self._terminating:
            return
        code = params.get("code")
        if code != 0 or self.turn_active:
            self._report_exit(
                f"the {self.record.options.agent} agent process exited ({params.get('status', code)})", params
            )
        else:
            self._status(
                "agent_exited", {"exit_code": code, "detail": "the agent exited; the next message starts it again"}
            )

    def _report_exit(self, message: str, params: dict[str, Any] | None = None) -> None:
        if self._exit_reported:
            return
        self._exit_reported = True
        details = {"exit_code": (params or {}).get("code"), "stderr": (params or {}).get("stderr", "")}
        if params is None and self._server is not None:  # the request failed before the exit notice was read
            details = {"exit_code": None, "stderr": ""}
        self.emit("error", {"message": message, "code": "agent_process_exited", "details": details}, source="daemon")

    # Permissions.

    def _permission_requested(self, message: dict[str, Any]) -> None:
        params = message.get("params") or {}
        tool = params.get("toolCall") or {}
        self._permissions += 1
        pending = _Pending(
            permission_id=f"perm_{self._permissions}",
            request_id=message["id"],
            action=str(tool.get("title") or tool.get("kind") or "tool"),
            options=[option for option in params.get("options") or [] if isinstance(option, dict)],
        )
        timeout = self.record.options.permission_timeout_ms / 1000
        loop = asyncio.get_running_loop()
        pending.timer = loop.call_later(timeout, lambda: loop.create_task(self._timed_out(pending.permission_id)))
        self._pending[pending.permission_id] = pending
        metadata = {
            "tool_call": tool,
            "options": pending.options,
            "timeout_ms": self.record.options.permission_timeout_ms,
        }
        self.emit(
            "permission.requested",
            {
                "permission_id": pending.permission_id,
                "action": pending.action,
                "status": "requested",
                "metadata": metadata,
            },
        )

    async def reply_permission(self, permission_id: str, reply: str) -> None:
        if permission_id not in self._pending:
            raise UnknownPermission(f"no pending permission request {permission_id}")
        await self._resolve(permission_id, reply, "client")

    async def _timed_out(self, permission_id: str) -> None:
        if permission_id in self._pending:
            await self._resolve(permission_id, self.record.options.permission_default, "timeout")

    async def _resolve_all(self, by: str) -> None:
        for permission_id in list(self._pending):
            await self._resolve(permission_id, None, by)

    async def _resolve(self, permission_id: str, reply: str | None, by: str) -> None:
        """Answer the agent (a `reply`, or `cancelled` without one) and log `permission.resolved`."""
        pending = self._pending.pop(permission_id, None)
        if pending is None:  # resolved meanwhile (a reply and a timeout, while an answer was being written)
            return
        if pending.timer is not None:
            pending.timer.cancel()
        option = _choose(pending.options, reply) if reply is not None else None
        outcome = {"outcome": "selected", "optionId": option} if option is not None else {"outcome": "cancelled"}
        await self._answer(pending.request_id, result={"outcome": outcome})
        status = _STATUS[reply] if reply is not None and option is not None else "reject"
        metadata = {"reply": reply, "option_id": option, "resolved_by": by}
        self.emit(
            "permission.resolved",
            {"permission_id": permission_id, "action": pending.action, "status": status, "metadata": metadata},
        )

    # The log.

    def emit(self, kind: str, data: dict[str, Any], source: str = "agent", synthetic: bool = False) -> None:
        if self.log.closed:
            return
        sequence = len(self.log) + 1
        event = UniversalEvent(
            event_id=f"evt_{sequence}",
            sequence=sequence,
            time=now(),
            session_id=self.record.session_id,
            native_session_id=self.record.native_session_id,
            source="daemon" if source == "daemon" else "agent",
            synthetic=synthetic,
            type=kind,
            data=data,
        )
        try:
            self.log.append(_encoder.encode(event))
        except OSError as exc:  # a full disk: this event is lost (the log stays whole), the session goes on
            logger.error("session %s: event %s not stored: %s", self.record.session_id, kind, exc)

    def _status(self, label: str, detail: dict[str, Any]) -> None:
        item = self._normaliser.item(
            "status", None, [{"type": "status", "label": label, "detail": detail}], status="completed"
        )
        self.emit("item.completed", {"item": item}, source="daemon", synthetic=True)

    def _save(self) -> None:
        write_private(os.path.join(self._directory, "session.json"), msgspec.json.encode(self.record))

    def recover(self) -> None:
        """After an executor restart: numbering goes on after the log's; a turn the log shows running ended."""
        last_turn = None
        for line in self.log.read(0):
            try:
                logged = _decode_logged(line)
            except (msgspec.DecodeError, msgspec.ValidationError):  # a record damaged on disk: the rest still counts
                logger.warning("session %s: an unreadable event in its log is skipped", self.record.session_id)
                continue
            if logged.type in ("turn.started", "turn.ended"):
                last_turn = logged.type
            elif logged.type == "permission.requested":
                self._permissions += 1
            item = logged.data.item
            if item is not None and item.item_id.startswith("itm_") and item.item_id[4:].isdigit():
                self._normaliser.resume_numbering(int(item.item_id[4:]))
        if last_turn == "turn.started":
            self.emit(
                "error",
                {"message": "the agent server restarted during this turn", "code": "interrupted"},
                source="daemon",
            )
            self.emit("turn.ended", {"phase": "interrupted"}, source="daemon", synthetic=True)
        if self.record.ended:
            self.log.close()


class _LoggedItem(msgspec.Struct):
    item_id: str


class _LoggedData(msgspec.Struct):
    item: _LoggedItem | None = None


class _Logged(msgspec.Struct):
    """What `recover` reads of a logged event."""

    type: str
    data: _LoggedData


_decode_logged = msgspec.json.Decoder(_Logged).decode


class AgentError(Exception):
    """The agent answered a request with a JSON-RPC error."""

    def __init__(self, method: str, error: dict[str, Any]) -> None:
        self.error = error
        self.message = f"{method} failed: {error.get('message', 'error')}"
        super().__init__(self.message)


def _choose(options: list[dict[str, Any]], reply: str) -> str | None:
    """The option id that means `reply`, by the options' kinds (ids differ per agent)."""
    for kind in _REPLY_KINDS[reply]:
        for option in options:
            if option.get("kind") == kind and option.get("optionId") is not None:
                return str(option["optionId"])
    return None


def write_private(path: str, data: bytes) -> None:
    """Write a file only root can read, atomically (a crash leaves the old or the new one)."""
    temporary = f"{path}.tmp"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(data)
    os.replace(temporary, path)


class SessionExists(Exception):
    """A session with this id was created before."""


class Sessions:
    """Every session of this sandbox, the ones of earlier executors included."""

    def __init__(self, hub: AcpHub, state_dir: str) -> None:
        self._hub = hub
        self._root = os.path.join(state_dir, "sessions")
        os.makedirs(self._root, mode=0o700, exist_ok=True)
        self._sessions: dict[str, Session] = {}
        for name in sorted(os.listdir(self._root)):
            try:
                self._load(name)
            except (OSError, ValueError) as exc:  # msgspec's errors are ValueErrors
                logger.warning("session %s cannot be read, skipped: %s", name, exc)

    def _load(self, name: str) -> None:
        directory = os.path.join(self._root, name)
        with open(os.path.join(directory, "session.json"), "rb") as file:
            record = msgspec.json.decode(file.read(), type=SessionRecord)
        with open(os.path.join(directory, "env.json"), "rb") as file:
            env = msgspec.json.decode(file.read(), type=dict[str, str])
        session = Session(self._hub, directory, record, env)
        session.recover()
        self._sessions[record.session_id] = session

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def newest_first(self) -> list[Session]:
        return sorted(self._sessions.values(), key=lambda session: session.record.created_at, reverse=True)

    async def create(self, session_id: str, options: CreateSessionRequest) -> Session:
        """A new session with its agent started; nothing is kept when the agent cannot start."""
        if session_id in self._sessions:
            raise SessionExists(f"session already exists: {session_id}")
        directory = os.path.join(self._root, session_id)
        shutil.rmtree(directory, ignore_errors=True)  # what an executor killed during a create left, unloaded
        os.makedirs(directory, mode=0o700)
        env = options.env
        record = SessionRecord(session_id, now(), msgspec.structs.replace(options, env={}))
        write_private(os.path.join(directory, "env.json"), msgspec.json.encode(env))
        write_private(os.path.join(directory, "session.json"), msgspec.json.encode(record))
        session = Session(self._hub, directory, record, env)
        self._sessions[session_id] = session
        try:
            await session.start()
        except BaseException:
            del self._sessions[session_id]
            session.log.close()
            shutil.rmtree(directory, ignore_errors=True)
            raise
        return session

    async def close(self) -> None:
        await asyncio.gather(*(session.close() for session in self._sessions.values()))

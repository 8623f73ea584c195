"""The egress guard: a sandbox pod's second container, which holds the sandbox to its egress rules on any CNI.

NetworkPolicies are objects and nothing more unless the CNI enforces them (a plain bridge does not), so each
sandbox pod also runs this (`agent-sandbox-egress-guard`, from the gateway's image). It is the local runtime's
egress proxy (`pool._local._egress`) run inside the pod's own network namespace instead of the host's: the
same nftables table rejects what the rules deny and redirects the sandbox's TCP and DNS to the guard's sockets,
and the guard checks each connection again (by address, or by the name it sends for a domain rule) before it
dials. Its own packets carry `GUARD_MARK`, which the table lets out; the sandbox's container holds neither
CAP_NET_ADMIN nor CAP_NET_RAW, so it can neither mark its packets nor change the table, and it shares no
process or mount namespace with the guard, so it cannot read the guard's key.

It starts closed (`CLOSED`: loopback only) and keeps whatever rules the gateway sent last in its state dir (an
emptyDir of its own), so a guard that restarts puts them back; the table itself outlives it in the namespace,
so a sandbox is never open while its guard is down. The gateway sends rules over `_guard_wire`'s protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import msgspec

from pool._errors import RuntimeFailure
from pool._kube._guard_wire import (
    GUARD_KEY_ENV,
    GUARD_MARK,
    GUARD_PORT,
    MAX_REQUEST_BYTES,
    decode_rules,
    encode_rules,
    new_nonce,
    signature_holds,
)
from pool._local._egress import Egress, EgressSettings
from pool._local._netns import SameNamespace
from pool._runtime import ALL_TRAFFIC, EgressRules

__all__ = ["CLOSED", "Guard", "GuardSettings", "main"]

_log = logging.getLogger("pool.egress_guard")
CLOSED = EgressRules(deny_out=ALL_TRAFFIC)  # E2B's allow_internet_access=false: what a pod has until told more
_SELF = "pod"  # the one sandbox an `Egress` of the guard knows
_RULES_FILE = "rules.json"
_REQUEST_SECONDS = 10.0


class GuardSettings(msgspec.Struct, frozen=True, kw_only=True):
    key: str  # the namespace's guard key (`_guard_wire`)
    state_dir: Path  # where the rules in force are kept across a restart of the guard
    dns_servers: tuple[str, ...] = ()  # where the sandbox's queries go; () = the pod's resolv.conf (cluster DNS)
    denied: tuple[str, ...] = ()  # CIDRs and IPs never reached, on top of the private ranges and the pod's own
    port: int = GUARD_PORT


class Guard:
    """The pod's egress, and the control server that replaces its rules."""

    def __init__(self, settings: GuardSettings) -> None:
        self._settings = settings
        egress = EgressSettings(dns_servers=settings.dns_servers, denied=settings.denied, mark=GUARD_MARK)
        self._egress = Egress(egress, SameNamespace())
        self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)  # SameNamespace ignores it
        self._lock = asyncio.Lock()  # one replacement at a time: the file and the table stay the same rules

    async def start(self) -> asyncio.Server:
        """Put the kept rules (else `CLOSED`) in force, then listen: once the port answers, the pod is guarded."""
        rules = self._kept() or CLOSED
        await self._egress.attach(_SELF, self._netns, rules)
        _log.info("egress guard: in force: %s", encode_rules(rules).decode())
        return await asyncio.start_server(self._serve, port=self._settings.port, limit=MAX_REQUEST_BYTES)

    def close(self) -> None:
        self._egress.close()
        os.close(self._netns)

    async def replace(self, rules: EgressRules) -> None:
        async with self._lock:
            await self._egress.attach(_SELF, self._netns, rules)
            path = self._settings.state_dir / _RULES_FILE
            temporary = path.with_suffix(".new")
            temporary.write_bytes(encode_rules(rules))
            temporary.replace(path)
        _log.info("egress guard: in force: %s", encode_rules(rules).decode())

    def _kept(self) -> EgressRules | None:
        try:
            return decode_rules((self._settings.state_dir / _RULES_FILE).read_bytes())
        except FileNotFoundError:
            return None
        except ValueError as exc:  # not ours (or cut short by a crash between write and rename: never, but)
            _log.warning("egress guard: the kept rules are unreadable, closed instead: %s", exc)
            return None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonce = new_nonce()
        try:
            writer.write(nonce + b"\n")
            async with asyncio.timeout(_REQUEST_SECONDS):
                line = await reader.readuntil(b"\n")
                answer = await self._answer(nonce, line.rstrip(b"\n"))
                writer.write(answer + b"\n")
                await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a caller gone, slow or oversized gets no answer: nothing was changed for it
        finally:
            writer.close()

    async def _answer(self, nonce: bytes, line: bytes) -> bytes:
        signature, _, body = line.partition(b" ")
        if not signature_holds(self._settings.key, nonce, body, signature):
            return b"error: not signed with this namespace's guard key"
        try:
            await self.replace(decode_rules(body))
        except (ValueError, RuntimeFailure, OSError) as exc:
            _log.warning("egress guard: rules refused: %s", exc)
            return f"error: {exc}".encode()
        return b"ok"


async def _run(settings: GuardSettings) -> None:
    guard = Guard(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stop.set)
    try:
        server = await guard.start()
        async with server:
            await stop.wait()
    finally:
        guard.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="agent-sandbox-egress-guard",
        description="Hold this pod's sandbox to its egress rules (run by the kubernetes runtime in every sandbox "
        f"pod). The key is ${GUARD_KEY_ENV}; the rules come from the gateway on --port.",
    )
    parser.add_argument("--state-dir", type=Path, required=True, help="where the rules in force are kept")
    parser.add_argument("--dns", action="append", default=[], help="a resolver for the sandbox (repeat; default: "
                        "the pod's /etc/resolv.conf)")  # fmt: skip
    parser.add_argument("--denied", action="append", default=[], help="an IP or CIDR never reached (repeat)")
    parser.add_argument("--port", type=int, default=GUARD_PORT, help=f"the control port (default {GUARD_PORT})")
    args = parser.parse_args(argv)
    key = os.environ.get(GUARD_KEY_ENV, "")
    if not key:
        sys.exit(f"agent-sandbox-egress-guard: ${GUARD_KEY_ENV} is not set")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    denied = tuple(entry for entry in args.denied if entry)  # an empty downward-API value (no host IP yet)
    settings = GuardSettings(
        key=key, state_dir=args.state_dir, dns_servers=tuple(args.dns), denied=denied, port=args.port
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(settings))


if __name__ == "__main__":
    main()

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
import ipaddress
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
    GUARD_POD_ENV,
    GUARD_PORT,
    MAX_REQUEST_BYTES,
    answer_mac,
    decode_rules,
    encode_rules,
    is_nonce,
    macs_match,
    new_nonce,
    request_mac,
)
from pool._local._egress import TABLE, Egress, EgressSettings
from pool._local._egress_policy import ALWAYS_DENIED, EgressPolicy
from pool._local._netns import SameNamespace
from pool._local._nft import run_nft
from pool._runtime import ALL_TRAFFIC, EgressRules

__all__ = ["CLOSED", "Guard", "GuardSettings", "main"]

_log = logging.getLogger("pool.egress_guard")
CLOSED = EgressRules(deny_out=ALL_TRAFFIC)  # E2B's allow_internet_access=false: what a pod has until told more
_SELF = "pod"  # the one sandbox an `Egress` of the guard knows
_RULES_FILE = "rules.json"
_REQUEST_SECONDS = 10.0
_MAX_CONTROL = 8  # control connections at a time (the gateway makes one per change)


class GuardSettings(msgspec.Struct, frozen=True, kw_only=True):
    key: str  # the namespace's guard key (`_guard_wire`)
    pod: str  # the name of this pod, which every request must name
    state_dir: Path  # where the rules in force are kept across a restart of the guard
    dns_servers: tuple[str, ...] = ()  # where the sandbox's queries go; () = the pod's resolv.conf (cluster DNS)
    denied: tuple[str, ...] = ()  # CIDRs and IPs never reached, on top of the private ranges and the pod's own


class Guard:
    """The pod's egress, and the control server that replaces its rules."""

    def __init__(self, settings: GuardSettings) -> None:
        self._settings = settings
        egress = EgressSettings(dns_servers=settings.dns_servers, denied=settings.denied, mark=GUARD_MARK)
        self._egress = Egress(egress, SameNamespace())
        self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)  # SameNamespace ignores it
        self._lock = asyncio.Lock()  # one replacement at a time: the file and the table stay the same rules
        self._serving = 0  # control connections open now (`_MAX_CONTROL`)
        self._rules: EgressRules | None = None  # in force now (None: not yet started)

    async def start(self) -> asyncio.Server:
        """Put the kept rules (else `CLOSED`) in force, then listen: once the port answers, the pod is guarded."""
        rules = self._kept() or CLOSED
        await self._egress.attach(_SELF, self._netns, rules)
        self._rules = rules
        _log.info("egress guard: in force: %s", encode_rules(rules).decode())
        return await asyncio.start_server(self._serve, port=GUARD_PORT, limit=MAX_REQUEST_BYTES)

    def close(self) -> None:
        self._egress.close()
        os.close(self._netns)

    async def replace(self, rules: EgressRules) -> None:
        """Put `rules` in force and keep them; on any failure neither (the kept file is written first, and only
        renamed into place once the table holds them)."""
        async with self._lock:
            if rules == self._rules:  # told again (a warm claim's rules, then its start's): in force already
                return
            path = self._settings.state_dir / _RULES_FILE
            temporary = path.with_suffix(".new")
            temporary.write_bytes(encode_rules(rules))
            try:
                await self._egress.attach(_SELF, self._netns, rules)
            except BaseException:
                temporary.unlink(missing_ok=True)
                raise
            temporary.replace(path)
            self._rules = rules
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
        """One request. Only from outside the pod: the sandbox reaches this port over loopback alone, and is
        closed on at once, as are callers past `_MAX_CONTROL` at a time."""
        peer = writer.get_extra_info("peername")
        if self._serving >= _MAX_CONTROL or peer is None or _is_loopback(peer[0]):
            writer.close()
            return
        self._serving += 1
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
            self._serving -= 1
            writer.close()

    async def _answer(self, nonce: bytes, line: bytes) -> bytes:
        theirs, _, rest = line.partition(b" ")
        signature, _, body = rest.partition(b" ")
        key, pod = self._settings.key, self._settings.pod
        if not is_nonce(theirs) or not macs_match(request_mac(key, nonce, theirs, pod, body), signature):
            return b"error: not signed with this namespace's guard key for this pod"
        try:
            await self.replace(decode_rules(body))
        except (ValueError, RuntimeFailure, OSError) as exc:
            _log.warning("egress guard: rules refused: %s", exc)
            return b"error: " + " ".join(str(exc).split()).encode()  # one line: the protocol's
        return b"ok " + answer_mac(key, nonce, theirs, pod, body)


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%")[0]).is_loopback or address.startswith("::ffff:127.")


def close_pod() -> None:
    """Put `CLOSED` in force and return: the pod's init container, so that the pod is closed before any of
    its containers starts (the guard's own start is not waited for), and stays so if the guard never starts."""
    run_nft(EgressPolicy(CLOSED, always_denied=ALWAYS_DENIED).ruleset(TABLE, replace=True, mark=GUARD_MARK))


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
        f"pod). The key is ${GUARD_KEY_ENV}, the pod's name ${GUARD_POD_ENV}; the rules come from the gateway on "
        f"port {GUARD_PORT}.",
    )
    parser.add_argument("--close", action="store_true", help="put no-internet in force and exit (the pod's "
                        "init container: closed before any other container starts)")  # fmt: skip
    parser.add_argument("--state-dir", type=Path, help="where the rules in force are kept (required to serve)")
    parser.add_argument("--dns", action="append", default=[], help="a resolver for the sandbox (repeat; default: "
                        "the pod's /etc/resolv.conf)")  # fmt: skip
    parser.add_argument("--denied", action="append", default=[], help="an IP or CIDR never reached (repeat)")
    args = parser.parse_args(argv)
    if args.close:
        close_pod()
        return
    key, pod = os.environ.get(GUARD_KEY_ENV, ""), os.environ.get(GUARD_POD_ENV, "")
    if not key or not pod or args.state_dir is None:
        sys.exit(f"agent-sandbox-egress-guard: serving needs ${GUARD_KEY_ENV}, ${GUARD_POD_ENV} and --state-dir")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    denied = tuple(entry for entry in args.denied if entry)  # an empty downward-API value (no host IP yet)
    settings = GuardSettings(key=key, pod=pod, state_dir=args.state_dir, dns_servers=tuple(args.dns), denied=denied)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(settings))


if __name__ == "__main__":
    main()

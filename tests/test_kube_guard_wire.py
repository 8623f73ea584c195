"""The gateway's side of the egress guard's protocol against what might hold the guard's port instead of it: an
`ok` is believed only with the guard's proof, and only for the pod the rules were meant for."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from pool import EgressRules
from pool._kube._guard_client import put_rules
from pool._kube._guard_wire import GuardRefused, answer_mac, is_nonce, new_nonce, request_mac

pytestmark = pytest.mark.anyio

KEY, POD = "k" * 64, "sandbox-abc-x1y2z"
Answer = Callable[[bytes, bytes, bytes, bytes], bytes]  # (guard nonce, request line's parts) -> answer line


async def _against(answer: Answer, *, nonce: bytes | None = None) -> None:
    """`put_rules` to a listener that sends `nonce` (a fresh one by default) and answers with `answer`."""

    served = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            ours = new_nonce() if nonce is None else nonce
            writer.write(ours + b"\n")
            line = (await reader.readline()).rstrip(b"\n")
            if line:  # (none from a caller that gave up)
                theirs, signature, body = line.split(b" ", 2)
                writer.write(answer(ours, theirs, signature, body) + b"\n")
            await writer.drain()
        finally:
            writer.close()
            await writer.wait_closed()
            served.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        sock = socket.socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, server.sockets[0].getsockname())
        try:
            await put_rules(sock, KEY, POD, EgressRules(deny_out=("198.51.100.0/24",)), within=5)
        finally:
            await served.wait()


def _as_the_guard(pod: str = POD, key: str = KEY) -> Answer:
    def answer(ours: bytes, theirs: bytes, signature: bytes, body: bytes) -> bytes:
        assert signature == request_mac(key, ours, theirs, pod, body)  # what the guard checks
        return b"ok " + answer_mac(key, ours, theirs, pod, body)

    return answer


async def test_the_guards_own_answer_is_believed() -> None:
    await _against(_as_the_guard())


@pytest.mark.parametrize(
    ("answer", "refusal"),
    [
        (lambda *_: b"ok", "not the egress guard's"),  # whoever holds the port, saying yes
        (lambda *_: b"ok " + b"0" * 64, "not the egress guard's"),
        (
            lambda ours, theirs, _s, body: b"ok " + answer_mac(KEY, ours, theirs, "another-pod", body),
            "not the egress guard's",
        ),  # another pod's proof
        (lambda *_: b"error: no", "refused the rules: error: no"),
    ],
    ids=["bare-ok", "wrong-proof", "other-pods-proof", "error"],
)
async def test_an_answer_without_the_guards_proof_is_refused(answer: Answer, refusal: str) -> None:
    with pytest.raises(GuardRefused, match=refusal):
        await _against(answer)


async def test_no_rules_are_signed_for_a_listener_that_sends_no_nonce() -> None:
    """Nothing it could use elsewhere: a signature over a line it chose is never sent."""
    signed: list[bytes] = []

    def record(*parts: bytes) -> bytes:
        signed.append(parts[2])
        return b"ok"

    with pytest.raises(GuardRefused, match="no nonce"):
        await _against(record, nonce=b"pick-me")
    assert signed == []


def test_nonces_are_hex_of_one_length() -> None:
    assert is_nonce(new_nonce())
    assert not is_nonce(b"pick-me")
    assert not is_nonce(new_nonce()[:-1])

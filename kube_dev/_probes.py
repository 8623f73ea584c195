"""Readiness probes: httpGet, tcpSocket and exec, each one attempt bounded by the probe's timeout.

A kubelet probes every `periodSeconds` from the start; the stand-in polls every 0.1 s until the first
success instead (and at `periodSeconds` after that), so a pod is Ready as soon as its server is: tests and
warm pools then see real start-up latency rather than the probe period.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping

from kube_dev._objects import Container, HTTPGetAction, Probe

__all__ = ["FIRST_SUCCESS_POLL", "probe_once"]

FIRST_SUCCESS_POLL = 0.1


def _port(port: int | str, container: Container) -> int:
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for declared in container.ports:
        if declared.name == port:
            return declared.container_port
    raise ValueError(f"container {container.name!r} declares no port named {port!r}")


async def _http_get(action: HTTPGetAction, host: str, port: int) -> bool:
    context = None
    if action.scheme.upper() == "HTTPS":  # as the kubelet does: TLS without verification
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    reader, writer = await asyncio.open_connection(host, port, ssl=context)
    try:
        headers = "".join(f"{h.name}: {h.value}\r\n" for h in action.http_headers)
        path = action.path if action.path.startswith("/") else "/" + action.path
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.20\r\n{headers}"
            "Connection: close\r\n\r\n".encode()
        )
        await writer.drain()
        status_line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    parts = status_line.split()
    return len(parts) >= 2 and parts[1].isdigit() and 200 <= int(parts[1]) < 400


async def _tcp(host: str, port: int) -> bool:
    _, writer = await asyncio.open_connection(host, port)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _exec(command: list[str], env: Mapping[str, str]) -> bool:
    proc = await asyncio.create_subprocess_exec(
        *command, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        return await proc.wait() == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def probe_once(probe: Probe, container: Container, pod_ip: str, env: Mapping[str, str]) -> bool:
    """One probe attempt: True on success; errors, refusals and timeouts are failures, as in Kubernetes."""
    try:
        async with asyncio.timeout(max(probe.timeout_seconds, 1)):
            if probe.http_get is not None:
                action = probe.http_get
                return await _http_get(action, action.host or pod_ip, _port(action.port, container))
            if probe.tcp_socket is not None:
                return await _tcp(probe.tcp_socket.host or pod_ip, _port(probe.tcp_socket.port, container))
            if probe.exec is not None:
                return await _exec(probe.exec.command, env)
            return True
    except (OSError, TimeoutError, ValueError, ssl.SSLError):
        return False

"""E2B's network options through the real `e2b` SDK: refused in E2B's words, echoed by `get_info`, private ports
behind the traffic token, the Host mask, and `update_network` (see tests/test_activator_network.py for the table of
what the validator takes).

Traffic goes only to the server on loopback and to servers inside the sandboxes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import ALL_TRAFFIC, Sandbox, Secret
from e2b.exceptions import SandboxException, SandboxNotFoundException
from e2b_code_interpreter import Sandbox as CodeInterpreter

from tests.server_fixtures import RunningServer, wait_for_port
from tests.tls_fixtures import self_signed

MISSING = "Sandbox is secured with traffic access token. Token header 'e2b-traffic-access-token' is missing"
INVALID = "Sandbox is secured with traffic access token. Provided token is invalid."
# A server that answers every GET with the Host header it got.
_HOST_ECHO = (
    "import http.server as h\n"
    "class E(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = (self.headers.get('Host') or '').encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body))); self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "h.HTTPServer(('127.0.0.1', 8000), E).serve_forever()\n"
)


def serve_host_echo(sbx: Sandbox, server: RunningServer) -> str:
    """Start the Host-echoing server on port 8000 of `sbx` (a no-op when one runs); its URL through the gateway."""
    sbx.files.write("/home/user/echo.py", _HOST_ECHO)
    sbx.commands.run("python3 /home/user/echo.py", background=True)
    wait_for_port(sbx, 8000)
    return f"http://{sbx.get_host(8000)}:{server.port}/"  # *.localhost resolves to loopback


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"network": {"deny_out": ["example.com"]}}, "invalid denied CIDR example.com"),
        ({"network": {"allow_out": ["example.com"]}}, "you must include 'ALL_TRAFFIC' in deny out"),
        ({"network": {"allow_out": ["0.0.0.0"], "deny_out": [ALL_TRAFFIC]}}, "invalid allowed address 0.0.0.0"),
        ({"network": {"mask_request_host": "bücher.de"}}, "mask request host 'bücher.de' is not ASCII"),
        ({"network": {"mask_request_host": "a:b:c"}}, "mask request host is not valid: a:b:c"),
        ({"network": {"rules": {"api.example.com": [{"transform": {"headers": {"X": "1"}}}]}}}, "network.rules"),
        ({"network": {"egress_proxy": {"address": "proxy.example.com:1080"}}}, "network.egressProxy"),
        ({"network": {"dns_servers": ["203.0.113.53"]}}, "network.dnsServers"),
        ({"network": {"https_ports": [49983]}}, "the envd port (49983) cannot be listed in httpsPorts"),
        ({"network": {"https_ports": [0]}}, "invalid https port 0"),
        ({"network": {"https_ports": list(range(1, 102))}}, "at most 100 may be listed"),
        ({"iam": {"tokens": {"aws": Secret.iam_token(audience="sts.example.com", token_type="JWT-SVID")}}}, "iam"),
    ],
)
def test_options_that_are_wrong_or_unserved_are_a_400_that_says_which(
    e2b_env: RunningServer, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(SandboxException, match="400") as refused:
        Sandbox.create(timeout=60, **options)
    assert message in str(refused.value)


def test_v1_private_ports_need_a_secured_envd(server: RunningServer) -> None:
    body = {"templateID": "base", "network": {"allowPublicTraffic": False}}
    response = httpx.post(server.url + "/sandboxes", json=body, headers={"X-API-Key": server.api_key})
    assert response.status_code == 400
    assert "unless you enable secure envd access" in response.json()["message"]


def test_an_unknown_network_option_is_refused_not_ignored(server: RunningServer) -> None:
    body = {"templateID": "base", "network": {"allowIn": ["203.0.113.0/24"]}}
    response = httpx.post(server.url + "/v2/sandboxes", json=body, headers={"X-API-Key": server.api_key})
    assert response.status_code == 400
    assert "allowIn" in response.json()["message"]


def test_get_info_echoes_the_options_in_force(sandboxes: list[Sandbox]) -> None:
    network = {"allow_out": ["203.0.113.7", "198.51.100.0/24"], "deny_out": [ALL_TRAFFIC], "mask_request_host": "x:1"}
    sbx = Sandbox.create(timeout=60, network=network)  # type: ignore[arg-type]
    sandboxes.append(sbx)
    info = sbx.get_info()
    assert info.network == {**network, "allow_public_traffic": True}
    offline = Sandbox.create(timeout=60, allow_internet_access=False, network={"deny_out": ["198.51.100.0/24"]})
    sandboxes.append(offline)
    info = offline.get_info()
    assert info.allow_internet_access is False
    assert info.network == {"deny_out": [ALL_TRAFFIC], "allow_public_traffic": True}  # ALL_TRAFFIC replaced it


def test_private_ports_need_the_traffic_token_and_envd_keeps_working(
    sandboxes: list[Sandbox], e2b_env: RunningServer
) -> None:
    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    sandboxes.append(sbx)
    token = sbx.traffic_access_token
    assert token
    url = serve_host_echo(sbx, e2b_env)  # envd (commands, files) needs no traffic token
    for headers, message in (({}, MISSING), ({"e2b-traffic-access-token": "wrong"}, INVALID)):
        refused = httpx.get(url, headers=headers)
        assert refused.status_code == 403
        assert refused.json() == {"sandboxId": sbx.sandbox_id, "message": message, "code": 403}
    assert httpx.get(url, headers={"e2b-traffic-access-token": token}).status_code == 200
    assert sbx.get_info().network == {"allow_public_traffic": False}


def test_an_https_port_is_reached_over_tls_and_echoed(
    sandboxes: list[Sandbox], e2b_env: RunningServer, tmp_path: Path
) -> None:
    """A server in the sandbox that speaks TLS itself, with a self-signed certificate, answers through the
    port URL, which stays plain HTTP here (the gateway's own TLS is the deployment's)."""
    sbx = Sandbox.create(timeout=120, network={"https_ports": [8443, 8443, 3000]})
    sandboxes.append(sbx)
    made = self_signed(tmp_path)
    sbx.files.write("/home/user/cert.pem", made.certificate.read_bytes())
    sbx.files.write("/home/user/key.pem", made.key.read_bytes())
    serve = (
        "import http.server as h, ssl\n"
        "c = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); c.load_cert_chain('cert.pem', 'key.pem')\n"
        "s = h.HTTPServer(('127.0.0.1', 8443), h.SimpleHTTPRequestHandler)\n"
        "s.socket = c.wrap_socket(s.socket, server_side=True); s.serve_forever()\n"
    )
    sbx.files.write("/home/user/tls.py", serve)
    sbx.files.write("/home/user/hello.txt", "over tls\n")
    sbx.commands.run("cd /home/user && python3 tls.py", background=True)
    wait_for_port(sbx, 8443)
    assert httpx.get(f"http://{sbx.get_host(8443)}:{e2b_env.port}/hello.txt").text == "over tls\n"
    assert sbx.get_info().network == {"allow_public_traffic": True, "https_ports": [3000, 8443]}


def test_the_traffic_token_survives_pause_and_connect(sandboxes: list[Sandbox], e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=120, network={"allow_public_traffic": False})
    sandboxes.append(sbx)
    token = sbx.traffic_access_token
    sbx.pause()
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.traffic_access_token == token
    url = serve_host_echo(again, e2b_env)
    assert httpx.get(url).status_code == 403
    assert httpx.get(url, headers={"e2b-traffic-access-token": token or ""}).status_code == 200


def test_code_interpreter_runs_code_behind_private_ports(e2b_env: RunningServer) -> None:
    sbx = CodeInterpreter.create("code-interpreter-v1", timeout=120, network={"allow_public_traffic": False})
    try:
        assert sbx.traffic_access_token
        assert sbx.run_code("6 * 7").text == "42"
    finally:
        sbx.kill()


def test_the_server_in_the_sandbox_sees_the_masked_host(sandboxes: list[Sandbox], e2b_env: RunningServer) -> None:
    sbx = Sandbox.create(timeout=60, network={"mask_request_host": "localhost:${PORT}"})
    sandboxes.append(sbx)
    assert httpx.get(serve_host_echo(sbx, e2b_env)).text == "localhost:8000"


def test_update_network_replaces_the_rules_and_is_echoed(sandboxes: list[Sandbox]) -> None:
    sbx = Sandbox.create(timeout=60, network={"deny_out": ["198.51.100.0/24"], "allow_public_traffic": False})
    sandboxes.append(sbx)
    sbx.update_network({"allow_out": ["203.0.113.7"], "deny_out": [ALL_TRAFFIC]})
    assert sbx.get_info().network == {
        "allow_out": ["203.0.113.7"], "deny_out": [ALL_TRAFFIC], "allow_public_traffic": False,
    }  # fmt: skip
    sbx.update_network({})  # what it omits is cleared
    assert sbx.get_info().network == {"allow_public_traffic": False}
    sbx.update_network({"allow_internet_access": False})
    info = sbx.get_info()
    assert (info.allow_internet_access, info.network) == (
        False,
        {"deny_out": [ALL_TRAFFIC], "allow_public_traffic": False},
    )
    with pytest.raises(SandboxException, match=r"invalid denied CIDR example\.com"):
        sbx.update_network({"deny_out": ["example.com"]})
    assert sbx.is_running()


def test_update_network_of_an_unknown_sandbox_is_not_found(e2b_env: RunningServer) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.update_network("nosuchsandbox0000000", {"deny_out": [ALL_TRAFFIC]})

"""The wildcard-DNS + TLS recipe: the SDK configured with only E2B_API_KEY, E2B_DOMAIN, E2B_API_URL and SSL_CERT_FILE.

The SDK then dials `https://49983-<id>.<domain>:443` for envd. A test CA issues a certificate for
`*.<domain>`; `*.localhost` names resolve to loopback (libnss-myhostname, installed by the set-up script).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.server_fixtures import RunningServer, running_server

DOMAIN = "tls-test.localhost"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    tmp = tmp_path_factory.mktemp("tls")
    ca = trustme.CA()
    cert = ca.issue_cert(f"*.{DOMAIN}", DOMAIN)
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    cert.private_key_pem.write_to_path(str(tmp / "key.pem"))
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp / "chain.pem"))
    args = ("--host", "::", "--tls-cert", str(tmp / "chain.pem"), "--tls-key", str(tmp / "key.pem"), "--domain", DOMAIN)
    with running_server(
        tmp / "data", *args, port=443, scheme="https", host=f"api.{DOMAIN}", ca_file=tmp / "ca.pem"
    ) as server:
        yield server, tmp / "ca.pem"


_CLIENT = """
from e2b import Sandbox
sbx = Sandbox.create()
try:
    assert sbx.commands.run("echo over tls").stdout == "over tls\\n"
    sbx.files.write("/home/user/tls.txt", "secret")
    assert sbx.files.read("/home/user/tls.txt") == "secret"
    print(sbx.get_host(8008))
finally:
    sbx.kill()
"""


def test_sdk_works_over_wildcard_tls_with_only_the_documented_variables(tls_server: tuple[RunningServer, Path]) -> None:
    server, ca_file = tls_server
    # A fresh process: the SDK's TLS stack reads SSL_CERT_FILE once, and no other E2B_* variable may leak in.
    env = {name: value for name, value in os.environ.items() if not name.startswith("E2B_")}
    env |= {
        "E2B_API_KEY": server.api_key,
        "E2B_DOMAIN": DOMAIN,
        "E2B_API_URL": f"https://api.{DOMAIN}",
        "SSL_CERT_FILE": str(ca_file),
    }
    result = subprocess.run([sys.executable, "-c", _CLIENT], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("8008-")
    assert result.stdout.strip().endswith(f".{DOMAIN}")

"""A self-signed certificate for `localhost`, made with the openssl command, for servers that speak TLS."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import NamedTuple


class SelfSigned(NamedTuple):
    certificate: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate, self.key)
        return context


def self_signed(directory: Path) -> SelfSigned:
    """A key and a certificate for CN=localhost in `directory` (one day, EC P-256)."""
    made = SelfSigned(directory / "cert.pem", directory / "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=localhost", "-keyout", str(made.key), "-out", str(made.certificate)],
        check=True, capture_output=True,
    )  # fmt: skip
    return made

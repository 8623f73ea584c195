"""The network options on `serve --runtime kubernetes`, through the real `e2b` SDK: egress rules are refused with
a 400 (nothing there enforces them yet), never a silent 201; private ports and the Host mask are the gateway's and
work as locally."""

from __future__ import annotations

import pytest
from e2b import ALL_TRAFFIC, Sandbox
from e2b.exceptions import SandboxException

from tests import kube_fixtures
from tests.test_kube_runtime_e2b import e2b_env, namespace, server

kube = kube_fixtures.kube
__all__ = ["e2b_env", "kube", "namespace", "server"]  # the module-scoped server of the kube E2B tests, reused

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

REFUSAL = "400: this server's kubernetes runtime cannot enforce egress rules yet"


@pytest.mark.parametrize(
    "options",
    [
        {"allow_internet_access": False},
        {"network": {"deny_out": ["203.0.113.0/24"]}},
        {"network": {"allow_out": ["203.0.113.7"]}},
    ],
)
def test_egress_rules_are_refused_not_ignored(options: dict[str, object]) -> None:
    with pytest.raises(SandboxException, match=REFUSAL):
        Sandbox.create(timeout=60, **options)  # type: ignore[arg-type]


def test_private_ports_work_and_update_network_refuses_rules() -> None:
    sbx = Sandbox.create(timeout=60, network={"allow_public_traffic": False})
    try:
        assert sbx.traffic_access_token
        with pytest.raises(SandboxException, match=REFUSAL):
            sbx.update_network({"deny_out": [ALL_TRAFFIC]})
        sbx.update_network({})  # the default rules are what every pod has
        assert sbx.get_info().network == {"allow_public_traffic": False}
    finally:
        sbx.kill()

"""The real `e2b` SDK on what this server does not serve yet, and on template references with a namespace or a tag.

An unserved route must not answer a bare 404: the SDK would report a running sandbox as not found, or
a delete as of something that does not exist. It answers 501 in E2B's shape, naming the feature.
"""

from __future__ import annotations

import httpx
import pytest
from e2b import Sandbox, Template
from e2b.exceptions import SandboxException

from tests.server_fixtures import RunningServer


def test_template_exists_answers_from_the_catalog(e2b_env: RunningServer) -> None:
    assert Template.exists("base")
    assert Template.exists("base:default")
    assert not Template.exists("no-such-template")


def test_a_namespace_and_the_default_tag_name_the_same_template(e2b_env: RunningServer) -> None:
    sbx = Sandbox.create("team/base:default", timeout=60)
    try:
        assert sbx.get_info().template_id == "base"
    finally:
        sbx.kill()
    with pytest.raises(SandboxException, match="has only the tag 'default'"):
        Sandbox.create("base:v2")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v2/templates"),
        ("PATCH", "/templates/tpl"),
        ("DELETE", "/secrets/abc"),
        ("GET", "/secrets"),
    ],
)
def test_every_unserved_route_answers_501_in_e2b_shape(server: RunningServer, method: str, path: str) -> None:
    response = httpx.request(method, server.url + path, headers={"X-API-Key": server.api_key}, json={})
    assert response.status_code == 501
    body = response.json()
    assert body["code"] == 501
    assert body["message"].endswith("is not supported by this server")


def test_unserved_routes_still_need_an_api_key(server: RunningServer) -> None:
    assert httpx.get(server.url + "/secrets").status_code == 401

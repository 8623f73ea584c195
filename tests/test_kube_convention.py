"""The stand-in kubelet's image → command convention, `$(VAR)` expansion and pod addresses (no cluster)."""

from __future__ import annotations

import sys

import pytest

from executor.envd import ENVD_PORT
from kube_dev._addresses import LoopbackAddresses
from kube_dev._convention import container_argv, expand, is_sandbox_image
from kube_dev._objects import Container


@pytest.mark.parametrize(
    ("image", "sandbox"),
    [
        ("agent-sandbox/sandbox-base", True),
        ("agent-sandbox/sandbox-base:0.1.0", True),
        ("ghcr.io/acme/agent-sandbox/sandbox-code-interpreter-v1:1.2", True),
        ("registry.local:5000/agent-sandbox/sandbox-base-node@sha256:" + "0" * 64, True),
        ("agent-sandbox/gateway:0.1.0", False),
        ("acme/sandbox-base", False),
        ("agent-sandbox/sandbox-", False),
        ("python:3.11", False),
    ],
)
def test_sandbox_images_are_recognised_by_repository_name(image: str, sandbox: bool) -> None:
    assert is_sandbox_image(image) is sandbox


@pytest.mark.parametrize(
    ("text", "expanded"),
    [
        ("$(A)-$(B)", "1-two"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("cost: $$5", "cost: $5"),
        ("no refs", "no refs"),
    ],
)
def test_references_expand_as_in_kubernetes(text: str, expanded: str) -> None:
    assert expand(text, {"A": "1", "B": "two"}) == expanded


def test_sandbox_image_runs_the_executor_on_the_pod_ip_in_a_home_of_its_own_with_the_args_last() -> None:
    container = Container(name="x", image="agent-sandbox/sandbox-base:dev", command=["ignored"],
                          args=["--default-user", "$(WHO)"])  # fmt: skip
    argv = container_argv(container, "127.0.0.9", {"WHO": "root"}, "/state/pods/ns_p_1")
    assert argv == [sys.executable, "-m", "executor", "--host", "127.0.0.9", "--port", str(ENVD_PORT),
                    "--home", "/state/pods/ns_p_1", "--default-user", "root"]  # fmt: skip


def test_other_images_run_command_and_args_verbatim_or_nothing() -> None:
    runs = Container(name="x", image="python:3.11", command=["python3", "-c"], args=["print('$(POD_IP)')"])
    assert container_argv(runs, "127.0.0.9", {"POD_IP": "127.0.0.9"}, "/h") == ["python3", "-c", "print('127.0.0.9')"]
    assert container_argv(Container(name="x", image="redis:7", args=["--save", ""]), "127.0.0.9", {}, "/h") is None


def test_addresses_skip_dot_zero_and_dot_one_and_are_not_reused_at_once() -> None:
    addresses = LoopbackAddresses(network=7)
    first = addresses.allocate()
    assert first == "127.7.0.2"
    addresses.release(first)
    assert addresses.allocate() == "127.7.0.3"
    many = {addresses.allocate() for _ in range(600)}
    assert all(not a.endswith((".0", ".1")) and a.startswith("127.7.") for a in many)
    assert len(many) == 600


def test_pod_network_must_be_an_octet() -> None:
    with pytest.raises(ValueError, match="not an octet"):
        LoopbackAddresses(network=256)

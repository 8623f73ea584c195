"""How the SDK's steps become layers and settings (`activator._e2b._template_steps`): labels, users, ENV."""

from __future__ import annotations

import msgspec
import pytest

from activator import InvalidRequest
from activator._e2b._template_steps import BaseRefused, BuildStart, plan_build
from pool import SANDBOX_PATH, DebootstrapLayer, Resources, RunLayer, Template

_BASE = Template(
    name="base", description="", layers=(DebootstrapLayer(),), env={"LANG": "C.UTF-8"}, start=(), ports=(),
    user="user", workdir="/home/user", resources=Resources(), warm=0, pause_after=None, snapshot_after=None,
)  # fmt: skip


def _plan(steps: list[dict[str, object]]) -> tuple[Template, tuple[str, ...]]:
    start = msgspec.convert({"fromTemplate": "base", "steps": steps}, BuildStart)
    plan = plan_build(start, name="t", build_id="b", resources=Resources(), resolve=lambda _: _BASE)
    return plan.template, plan.labels


def test_env_values_are_expanded_as_a_shell_would_with_the_env_so_far() -> None:
    template, _ = _plan([
        {"type": "ENV", "args": ["TOOLS", "/opt/tools", "PATH", "$TOOLS/bin:$PATH"]},
        {"type": "ENV", "args": ["GREETING", "hi ${MISSING}there", "AT", "$HOME/x", "CMD", "$(date)"]},
        {"type": "RUN", "args": ["echo $PATH"]},
    ])  # fmt: skip
    assert template.env["PATH"] == f"/opt/tools/bin:{SANDBOX_PATH}"
    assert template.env["GREETING"] == "hi there"
    assert template.env["AT"] == "/home/user/x"
    assert template.env["CMD"] == "$(date)"  # command substitutions are not run
    run = template.layers[-1]
    assert isinstance(run, RunLayer)
    assert run.env["PATH"] == template.env["PATH"]


def test_each_layer_is_labelled_with_the_sdk_step_it_comes_from() -> None:
    template, labels = _plan([
        {"type": "ENV", "args": ["A", "1"]},
        {"type": "USER", "args": ["worker"]},
        {"type": "RUN", "args": ["true", "root"]},
        {"type": "WORKDIR", "args": ["/srv"]},
    ])  # fmt: skip
    assert labels == ("base", "2", "3", "4")  # ENV (step 1) makes no layer
    assert (template.user, template.workdir) == ("worker", "/srv")
    root_run = template.layers[2]
    assert isinstance(root_run, RunLayer)
    assert root_run.user == "root"


@pytest.mark.parametrize(
    "step",
    [
        {"type": "ENV", "args": ["ODD"]},
        {"type": "USER", "args": ["Not A User"]},
        {"type": "COPY", "args": ["a", "/b"]},
        {"type": "RUN", "args": []},
    ],
)
def test_a_malformed_step_is_a_400_naming_its_number(step: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest, match=r"^step 1: "):
        _plan([step])


def test_a_snapshot_with_memory_is_refused_as_a_base() -> None:
    start = msgspec.convert({"fromTemplate": "mem-snap", "steps": []}, BuildStart)
    snapshot = msgspec.structs.replace(_BASE, memory_image="0123")
    with pytest.raises(BaseRefused, match="'mem-snap' is a snapshot with memory: build from a snapshot taken with"):
        plan_build(start, name="t", build_id="b", resources=Resources(), resolve=lambda _: snapshot)

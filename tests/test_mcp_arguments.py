"""Tool arguments: flat JSON schemas for the model, and validation errors that say what to fix."""

from __future__ import annotations

import pytest

from activator._mcp._arguments import (
    CreateSandbox,
    DeleteSandbox,
    GetSandbox,
    GetUrl,
    ListFiles,
    ListSandbox,
    ReadFile,
    RunCode,
    RunCommand,
    SandboxExecutor,
    WriteFile,
    input_schema,
    parse,
)
from activator._mcp._errors import BadArguments

ALL = [CreateSandbox, GetSandbox, ListSandbox, DeleteSandbox, SandboxExecutor]
ALL += [RunCommand, ReadFile, WriteFile, ListFiles, GetUrl, RunCode]


@pytest.mark.parametrize("args", ALL, ids=lambda args: args.__name__)
def test_schemas_are_flat_objects_that_refuse_unknown_keys(args: type[CreateSandbox]) -> None:
    schema = input_schema(args)
    assert schema["type"] == "object"
    assert schema["additionalProperties"] is False
    assert "$ref" not in str(schema)
    assert "anyOf" not in str(schema)
    assert all(prop.get("description") for prop in schema["properties"].values())


def test_keys_are_camel_case_and_defaults_apply() -> None:
    args = parse(SandboxExecutor, {"sandboxId": "abc", "tool": "read_file"}, "sandboxExecutor")
    assert (args.sandbox_id, args.tool, args.arguments) == ("abc", "read_file", {})
    assert parse(CreateSandbox, None, "createSandbox").template == "base"


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({}, "missing required field `command`"),
        ({"command": 5}, "Expected `str`, got `int` - at `$.command`"),
        ({"command": "ls", "timeout": 0}, "Expected `float` > 0.0 - at `$.timeout`"),
        ({"command": "ls", "shell": "zsh"}, "unknown field `shell`"),
    ],
)
def test_bad_arguments_name_the_problem_and_show_the_schema(arguments: dict[str, object], problem: str) -> None:
    with pytest.raises(BadArguments) as raised:
        parse(RunCommand, arguments, "run_command")
    assert problem in raised.value.message
    assert raised.value.message.startswith("invalid arguments for run_command: ")
    assert 'Its input schema: {"type":"object"' in raised.value.message

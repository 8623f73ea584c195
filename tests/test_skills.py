"""The skills in `skills/*/SKILL.md` are followed literally: their code blocks run against a live server.

Convention: every ```sh / ```bash / ```python block is preceded by a line `<!-- test -->` (run here, with
`E2B_API_KEY`, `E2B_API_URL` and `E2B_SANDBOX_URL` set for the session's server, the venv's `python` and
`agent-sandbox` first on PATH, in an empty directory) or `<!-- not tested: why -->`. A block passes when it
exits 0; each is self-contained and cleans up after itself, so a skill that drifts from the product fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server_fixtures import REPO, RunningServer

SKILLS = REPO / "skills"
NAMES = ("e2b", "e2b-sandbox", "e2b-code-interpreter", "ai-deploy", "computer-use", "coding-agents")
_RUNNERS = {"sh": ["bash", "-euo", "pipefail"], "bash": ["bash", "-euo", "pipefail"], "python": [sys.executable]}
_BLOCK = re.compile(r"^(?P<marker><!--.*?-->\n)?```(?P<lang>\w+)\n(?P<code>.*?)^```$", re.MULTILINE | re.DOTALL)
_FRONTMATTER = re.compile(r"\A---\nname: (?P<name>.+)\ndescription: (?P<description>.+)\n---\n")


class Block:
    """One fenced code block of a skill: where it is, its language, its code, and whether it is to run."""

    def __init__(self, skill: str, line: int, lang: str, code: str, marker: str) -> None:
        self.skill, self.line, self.lang, self.code, self.marker = skill, line, lang, code, marker.strip()

    @property
    def id(self) -> str:
        return f"{self.skill}:{self.line}"


def blocks(skill: str) -> list[Block]:
    text = (SKILLS / skill / "SKILL.md").read_text()
    return [
        Block(skill, text.count("\n", 0, m.start("code")), m["lang"], m["code"], m["marker"] or "")
        for m in _BLOCK.finditer(text)
    ]


RUNNABLE = [block for skill in NAMES for block in blocks(skill) if block.marker == "<!-- test -->"]


def test_the_skills_are_there_and_nothing_else() -> None:
    assert sorted(p.name for p in SKILLS.iterdir() if p.is_dir()) == sorted(NAMES)


@pytest.mark.parametrize("skill", NAMES)
def test_a_skill_names_itself_and_says_when_to_use_it(skill: str) -> None:
    found = _FRONTMATTER.match((SKILLS / skill / "SKILL.md").read_text())
    assert found, "SKILL.md starts with --- name: ... description: ... ---"
    assert found["name"] == skill
    assert found["description"].startswith("Use when")


@pytest.mark.parametrize("skill", NAMES)
def test_every_command_block_is_run_or_says_why_not(skill: str) -> None:
    commands = [block for block in blocks(skill) if block.lang in _RUNNERS]
    unmarked = [block.id for block in commands if not re.fullmatch(r"<!-- (test|not tested: .+) -->", block.marker)]
    assert not unmarked, "precede each block with <!-- test --> or <!-- not tested: why -->"
    assert any(block.marker == "<!-- test -->" for block in commands), "a skill with nothing tested can drift"


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.id for block in RUNNABLE])
def test_the_block_runs_against_the_server(block: Block, server: RunningServer, tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("E2B_")}
    env |= server.e2b_env() | {"PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}
    result = subprocess.run(
        [*_RUNNERS[block.lang], "-"], input=block.code, cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, f"{block.id} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"

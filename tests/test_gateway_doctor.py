"""`agent-sandbox doctor` on this machine: real trials, a report, and an exit status that means something."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli._doctor import doctor
from gateway._settings import ServeSettings
from pool import ImageStore
from pool._local._criu import criu_dir
from tests.runtime_fixtures import IMAGE_CACHE, TEMPLATES


def test_doctor_passes_here_and_starts_a_real_sandbox(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = ServeSettings(data_dir=tmp_path, image_cache=IMAGE_CACHE)
    ImageStore(IMAGE_CACHE, settings.executor_source).build(TEMPLATES["base"], lambda _line: None)
    assert doctor(settings, criu_dir=criu_dir()) == 0
    report = capsys.readouterr().out
    assert "'base' sandbox started and answered" in report, report
    for name in ("bubblewrap", "cgroups", "user namespaces", "seccomp", "images", "criu"):
        assert f" {name} " in report, report
    assert "sandboxes can run here" in report
    assert list(tmp_path.iterdir()) == []  # the trial sandbox left nothing behind


def test_doctor_fails_on_templates_that_do_not_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "broken.toml").write_text('name = "other"\n')
    assert doctor(ServeSettings(data_dir=tmp_path, templates=tmp_path), criu_dir=None) == 1
    assert "sandboxes cannot run here (templates)" in capsys.readouterr().out

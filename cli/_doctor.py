"""`agent-sandbox doctor`: can this machine run sandboxes, and what will their snapshots keep?

The checks themselves are the pool's (`pool.check_platform`): real trials, not version sniffing. This
prints them one a line and answers with the exit status: 0 when sandboxes can run here.
"""

from __future__ import annotations

from pathlib import Path

from gateway import ServeSettings
from pool import DEFAULT_CRIU_DIR, PlatformCheck, TemplateError, check_platform, load_templates

__all__ = ["doctor"]


def doctor(settings: ServeSettings, *, criu_dir: Path | None = DEFAULT_CRIU_DIR) -> int:
    """Print a report of the platform checks; return 0 when every required one passed, else 1."""
    try:
        templates = load_templates(settings.templates)
    except TemplateError as exc:
        checks = [PlatformCheck(name="templates", ok=False, detail=str(exc))]
    else:
        checks = check_platform(
            data_dir=settings.data_dir, image_cache=settings.image_cache, executor_source=settings.executor_source,
            templates=templates, criu_dir=criu_dir,
        )  # fmt: skip
    for check in checks:
        print(f"  {_mark(check):<5} {check.name:<16} {check.detail}")
    failed = [check.name for check in checks if check.required and not check.ok]
    if failed:
        print(f"agent-sandbox doctor: sandboxes cannot run here ({', '.join(failed)})")
        return 1
    criu = next((check for check in checks if check.name == "criu"), None)
    kept = "processes and memory" if criu is not None and criu.ok else "files only"
    print(f"agent-sandbox doctor: sandboxes can run here; snapshots keep {kept}")
    return 0


def _mark(check: PlatformCheck) -> str:
    if check.ok:
        return "ok"
    return "FAIL" if check.required else "warn"

"""The code a kernel runs around an execution to give it the request's environment variables, then undo it.

`env_vars` of `/execute` apply to that execution only (e2b-protocol.md §4.1), but a kernel is one long-lived
process: the variables are set in it, silently, before the code runs, and the previous values are put back
after. Names are checked by the service first (`valid_env_name`), so they can be pasted into code.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping

__all__ = ("restore_env_code", "set_env_code", "valid_env_name")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_PYTHON_SET = """import os as __e2b_os
__e2b_saved_env = {{name: __e2b_os.environ.get(name) for name in {names!r}}}
__e2b_os.environ.update({env!r})
del __e2b_os"""

_PYTHON_RESTORE = """import os as __e2b_os
for __e2b_name, __e2b_value in __e2b_saved_env.items():
    if __e2b_value is None:
        __e2b_os.environ.pop(__e2b_name, None)
    else:
        __e2b_os.environ[__e2b_name] = __e2b_value
del __e2b_os, __e2b_saved_env, __e2b_name, __e2b_value"""


_R_RESTORE = """for (.e2b_name in names(.e2b_saved_env)) {
  if (is.na(.e2b_saved_env[[.e2b_name]])) Sys.unsetenv(.e2b_name)
  else do.call(Sys.setenv, setNames(list(.e2b_saved_env[[.e2b_name]]), .e2b_name))
}
rm(.e2b_saved_env, .e2b_name)"""


def _r_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # JSON's escapes (\" \\ \n \u0001) are R's too


def valid_env_name(name: str) -> bool:
    """A name every shell accepts (and so every kernel)."""
    return _NAME.fullmatch(name) is not None


def set_env_code(language: str, env: Mapping[str, str]) -> str:
    """Code that remembers the current values of `env`'s names, then sets them."""
    if language == "bash":
        return "\n".join(
            f"__e2b_had_{name}=${{{name}+1}}; __e2b_old_{name}=${{{name}-}}; export {name}={shlex.quote(value)}"
            for name, value in env.items()
        )
    if language == "r":
        names = ", ".join(_r_string(name) for name in sorted(env))
        values = ", ".join(f"`{name}` = {_r_string(value)}" for name, value in env.items())
        return f".e2b_saved_env <- Sys.getenv(c({names}), unset = NA, names = TRUE)\nSys.setenv({values})"
    return _PYTHON_SET.format(names=sorted(env), env=dict(env))


def restore_env_code(language: str, env: Mapping[str, str]) -> str:
    """Code that puts back what `set_env_code` remembered."""
    if language == "bash":
        return "\n".join(
            f'if [ -n "$__e2b_had_{name}" ]; then export {name}="$__e2b_old_{name}"; else unset {name}; fi; '
            f"unset __e2b_had_{name} __e2b_old_{name}"
            for name in env
        )
    if language == "r":
        return _R_RESTORE
    return _PYTHON_RESTORE

"""`python tests/no_pickle_main.py ARGS…`: the omni-console CLI with every unpickling entry point disabled.

For tests that run the CLI as a child process: `torch.load`, `torch.serialization.load`, `pickle.load`,
`pickle.loads` and `pickle.Unpickler` raise, and each call is also reported on stderr as
`UNPICKLE-CALLED <name>` so a test sees it even if the CLI turned the exception into one line.
"""

from __future__ import annotations

import pickle
import sys

import torch

MARK = "UNPICKLE-CALLED"


class Unpickled(BaseException):
    """Not an Exception: no `except Exception` in the code under test can swallow it."""


def _forbidden(name: str):
    def refuse(*args: object, **kwargs: object) -> None:
        sys.stderr.write(f"{MARK} {name}\n")
        raise Unpickled(f"{name} called")
    return refuse


class _ForbiddenUnpickler:
    def __init__(self, *args: object, **kwargs: object) -> None:
        _forbidden("pickle.Unpickler")()


def forbid_unpickling() -> None:
    torch.load = _forbidden("torch.load")  # type: ignore[assignment]
    torch.serialization.load = _forbidden("torch.serialization.load")  # type: ignore[assignment]
    pickle.load = _forbidden("pickle.load")  # type: ignore[assignment]
    pickle.loads = _forbidden("pickle.loads")  # type: ignore[assignment]
    pickle.Unpickler = _ForbiddenUnpickler  # type: ignore[assignment,misc]


if __name__ == "__main__":
    forbid_unpickling()
    from omni_console.console.cli import main

    sys.exit(main(sys.argv[1:]))

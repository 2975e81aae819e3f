"""One way to intercept a module call (offload/module_hooks.py): hooks and wrappers removed together."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from omni_console.offload.module_hooks import Hooks, Listeners

ROOT = Path(__file__).resolve().parents[2]


class Vae(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)

    def decode(self, x: torch.Tensor) -> str:
        return "decoded"


def test_hooks_run_in_order_and_remove_leaves_the_module_as_it_was():
    m = Vae()
    seen: list[str] = []
    hooks = Hooks()
    hooks.before(m, lambda *_: seen.append("pre"))
    hooks.before(m, lambda *_: seen.append("first"), prepend=True)
    hooks.after(m, lambda *_: seen.append("post"))
    hooks.wrap(m, "decode", lambda fn: lambda *a: f"wrapped {fn(*a)}")
    assert len(hooks) == 4
    x = torch.ones(1, 2)
    m(x)
    assert seen == ["first", "pre", "post"]
    assert m.decode(x) == "wrapped decoded"
    hooks.remove()
    seen.clear()
    m(x)
    assert seen == [] and m.decode(x) == "decoded" and "decode" not in vars(m)
    assert not m._forward_hooks and not m._forward_pre_hooks
    hooks.remove()  # idempotent


def test_a_wrapper_over_an_instance_attribute_puts_that_attribute_back():
    m = Vae()

    def own(x: torch.Tensor) -> str:
        return "own"

    m.decode = own  # type: ignore[method-assign]
    outer, inner = Hooks(), Hooks()
    inner.wrap(m, "decode", lambda fn: lambda *a: f"inner {fn(*a)}")
    outer.wrap(m, "decode", lambda fn: lambda *a: f"outer {fn(*a)}")
    assert m.decode(None) == "outer inner own"
    outer.remove()
    assert m.decode(None) == "inner own"
    inner.remove()
    assert vars(m)["decode"] is own


def test_an_after_hook_with_always_call_runs_when_the_forward_raises():
    m = Vae()
    seen: list[str] = []
    hooks = Hooks()
    hooks.after(m, lambda *_: seen.append("always"), always_call=True)
    with pytest.raises(RuntimeError):
        m(torch.ones(1, 3))  # wrong width: the Linear raises
    assert seen == ["always"]
    hooks.remove()


def test_listeners_are_called_until_removed():
    changed = Listeners()
    calls: list[int] = []
    remove = changed.add(lambda: calls.append(1))
    changed()
    remove()
    changed()
    remove()  # removing twice is harmless
    assert calls == [1]


def test_no_module_call_is_intercepted_any_other_way():
    """Forward hooks are registered and methods replaced only through offload/module_hooks.py."""
    direct = re.compile(r"register_forward(_pre)?_hook\(|register_module_forward|\.forward = |vars\([^)]*\)\.pop\(")
    offenders = []
    for folder in ("offload", "engine", "console", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "module_hooks.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if direct.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert offenders == []

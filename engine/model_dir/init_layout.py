"""What a diffusers model class's `__init__` assigns, read from the installed package's source text.

Discovery needs two facts about a DiT class: the order its `__init__` registers child modules
(the order its forward runs its block lists) and which config key sizes each block list. Building
the class to find out costs whatever the config asks for (`num_layers: 1000000` is a million
modules) and importing diffusers alone takes seconds, so this module reads the source instead:
the class is found by following diffusers' own `from .x import Name` re-exports on disk (nothing
is imported or run, and nothing outside the installed diffusers package is opened), then its
`__init__` is walked with `ast`. The cost depends only on diffusers' source, never on a config.

`__init__` is read in source order, following `super().__init__(...)` and `self.helper(...)` calls
into the class hierarchy, and unrolling `for name, ... in (("video", ...), ("audio", ...))` loops
so that `setattr(self, f"{name}_blocks", ...)` is named. A block-list size is only reported where
it is certain: `self.ATTR = nn.ModuleList([... for _ in range(KEY)])` run unconditionally by
`__init__` itself, with KEY an `__init__` argument that is never rebound or `self.config.KEY`.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field

from .class_index_cache import remembered
from .installed_source import MAX_HOPS, SourceModule, class_statement, locate

PACKAGE = "diffusers"
_MODULE_METHODS = frozenset({"add_module", "register_module", "register_buffer", "register_parameter"})


@dataclass(frozen=True, slots=True)
class ListCount:
    """A `self.ATTR = nn.ModuleList([... for _ in range(KEY)])`: its length is config[KEY]."""

    attr: str
    key: str


@dataclass(frozen=True, slots=True)
class InitLayout:
    """Attributes a model class's `__init__` assigns to `self`, in order, and how lists are sized."""

    order: tuple[str, ...]
    counts: tuple[ListCount, ...]


@functools.lru_cache(maxsize=128)
def init_layout(class_name: str) -> InitLayout | None:
    """The layout of `diffusers.<class_name>.__init__`, or None when its source cannot be read (kept across
    processes per installed diffusers: `class_index_cache`)."""
    if not class_name.isidentifier() or class_name.startswith("_"):
        return None
    def compute() -> dict | None:
        return _layout_to_json(_read_layout(class_name))

    # a cached layout is confirmed by reading the class again (one module, tens of ms): a poisoned file must not
    # drop a count check or reorder the blocks
    value = remembered("layout", PACKAGE, class_name, compute, lambda cached: cached == compute())
    return None if value is None else InitLayout(tuple(value["order"]),
                                                 tuple(ListCount(attr, key) for attr, key in value["counts"]))


def _layout_to_json(layout: InitLayout | None) -> dict | None:
    return None if layout is None else {"order": list(layout.order),
                                        "counts": [[c.attr, c.key] for c in layout.counts]}


def _read_layout(class_name: str) -> InitLayout | None:
    package = locate(PACKAGE)
    found = _in_package(class_statement(package, class_name, 0)) if package else None
    if found is None:
        return None
    try:
        return _InitReader(_mro(*found, 0)).layout()
    except RecursionError:
        return None


def _in_package(found: tuple[SourceModule, ast.ClassDef] | None) -> tuple[SourceModule, ast.ClassDef] | None:
    """Only diffusers' own classes make a diffusers layout."""
    return found if found and found[0].name.split(".")[0] == PACKAGE else None


def _mro(module: SourceModule, cls: ast.ClassDef, hops: int) -> list[tuple[SourceModule, ast.ClassDef]]:
    """The class and its diffusers bases, depth first (Python's MRO for single-chain hierarchies)."""
    chain = [(module, cls)]
    for base in cls.bases:
        if not isinstance(base, ast.Name) or hops >= MAX_HOPS:
            continue
        found = _in_package(class_statement(module, base.id, 0))
        if found:
            chain += [c for c in _mro(*found, hops + 1) if all(c[1] is not k for _, k in chain)]
    return chain


# --- reading __init__ -----------------------------------------------------------------------------

def _self_attr(node: ast.expr, self_name: str) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == self_name:
        return node.attr
    return None


def _own_calls(node: ast.stmt) -> list[ast.Call]:
    """Calls in a statement's own expressions (not in the bodies of a compound statement), in order."""
    calls = []
    for _, value in ast.iter_fields(node):
        for part in value if isinstance(value, list) else [value]:
            if isinstance(part, ast.expr):
                calls += [n for n in ast.walk(part) if isinstance(n, ast.Call)]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _name_of(node: ast.expr, env: dict[str, object]) -> str | None:
    """A constant string, or an f-string whose parts are constants or names bound by an unrolled loop."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            parts.append(str(part.value))
        elif (isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and part.conversion == -1
              and part.format_spec is None and isinstance(env.get(part.value.id), str)):
            parts.append(str(env[part.value.id]))
        else:
            return None
    return "".join(parts)


def _unrolled(loop: ast.For) -> list[dict[str, object]] | None:
    """Per-iteration constants of `for a, b in (("x", v), ("y", w))`; None when not such a loop."""
    if not isinstance(loop.iter, ast.Tuple | ast.List):
        return None
    targets = loop.target.elts if isinstance(loop.target, ast.Tuple) else [loop.target]
    if not all(isinstance(t, ast.Name) for t in targets):
        return None
    envs = []
    for item in loop.iter.elts:
        values = item.elts if isinstance(loop.target, ast.Tuple) and isinstance(item, ast.Tuple) else [item]
        if len(values) != len(targets):
            return None
        envs.append({t.id: v.value for t, v in zip(targets, values, strict=True) if isinstance(v, ast.Constant)})
    return envs


def _parameters(init: ast.FunctionDef) -> set[str]:
    """__init__ parameter names after self: register_to_config stores each as a config key."""
    args = init.args
    return {a.arg for a in (args.posonlyargs + args.args)[1:] + args.kwonlyargs}


@dataclass
class _InitReader:
    """Walks `__init__` (and what it calls on self) in source order, recording `self.X = ...`."""

    mro: list[tuple[SourceModule, ast.ClassDef]]
    order: list[str] = field(default_factory=list)
    values: dict[str, list[ast.expr | None]] = field(default_factory=dict)  # None: not countable
    mutated: set[str] = field(default_factory=set)
    returned: bool = False

    def layout(self) -> InitLayout | None:
        found = self._method("__init__", 0)
        if found is None:
            return None
        _, init = found
        self._read_function(found, 0)
        params = _parameters(init)
        rebound = {n.id for n in ast.walk(init) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del)}
        self_name = init.args.args[0].arg
        counts = []
        for attr, values in self.values.items():
            if len(values) == 1 and values[0] is not None and attr not in self.mutated:
                key = _count_key(values[0], params, rebound, self_name)
                if key:
                    counts.append(ListCount(attr, key))
        return InitLayout(tuple(self.order), tuple(counts))

    def _method(self, name: str, start: int) -> tuple[int, ast.FunctionDef] | None:
        for index, (_, cls) in enumerate(self.mro[start:], start):
            for node in cls.body:
                if isinstance(node, ast.FunctionDef) and node.name == name:
                    return index, node
        return None

    def _read_function(self, found: tuple[int, ast.FunctionDef], depth: int) -> None:
        index, function = found
        if function.args.args and depth <= MAX_HOPS:
            self._read(function.body, function.args.args[0].arg, index, depth, {}, countable=depth == 0)

    def _read(self, body: list[ast.stmt], self_name: str, index: int, depth: int, env: dict[str, object],
              countable: bool) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            for call in _own_calls(node):
                self._follow(call, self_name, index, depth)
            self._record(node, self_name, env, countable and not self.returned)
            if depth == 0 and any(isinstance(n, ast.Return) for n in ast.walk(node)):
                self.returned = True  # what follows an early return in __init__ may not run
            envs = _unrolled(node) if isinstance(node, ast.For) else None
            for loop_env in envs if envs is not None else [env]:
                nested = {**env, **loop_env}
                for part in ("body", "orelse", "finalbody"):
                    self._read(getattr(node, part, []), self_name, index, depth, nested, countable=False)
                for sub in getattr(node, "handlers", []) + getattr(node, "cases", []):
                    self._read(sub.body, self_name, index, depth, nested, countable=False)

    def _follow(self, call: ast.Call, self_name: str, index: int, depth: int) -> None:
        """Read what `super().__init__(...)` and `self.helper(...)` assign, where they are called."""
        func = call.func
        if (isinstance(func, ast.Attribute) and func.attr == "__init__" and isinstance(func.value, ast.Call)
                and isinstance(func.value.func, ast.Name) and func.value.func.id == "super"):
            found = self._method("__init__", index + 1)
        else:
            name = _self_attr(func, self_name)
            found = self._method(name, 0) if name and name not in _MODULE_METHODS else None
        if found:
            self._read_function(found, depth + 1)

    def _record(self, node: ast.stmt, self_name: str, env: dict[str, object], countable: bool) -> None:
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute) and n.attr in ("append", "extend", "insert", "pop", "__setitem__"):
                self.mutated.add(_self_attr(n.value, self_name) or "")
            elif isinstance(n, ast.Delete):
                self.mutated.update(_self_attr(t, self_name) or "" for t in n.targets)
        for attr, value in _assigned(node, self_name, env):
            self.values.setdefault(attr, []).append(value if countable else None)
            # a constant (`self.x = None`) never registers a module, so it does not fix x's position
            if attr not in self.order and not isinstance(value, ast.Constant):
                self.order.append(attr)


def _assigned(node: ast.stmt, self_name: str, env: dict[str, object]) -> list[tuple[str, ast.expr | None]]:
    """(attr, value) for each `self.attr = value` in this statement; value None when not a plain one."""
    if isinstance(node, ast.Assign):
        out = []
        for target in node.targets:
            elements = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
            single = len(node.targets) == 1 and len(elements) == 1
            out += [(a, node.value if single else None) for e in elements if (a := _self_attr(e, self_name))]
        return out
    if isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
        attr = _self_attr(node.target, self_name)
        return [(attr, node.value if isinstance(node, ast.AnnAssign) else None)] if attr else []
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):  # add_module("x", m), setattr(self, "x", m)
        call, name = node.value, None
        if _self_attr(call.func, self_name) in ("add_module", "register_module") and call.args:
            name = _name_of(call.args[0], env)
        elif (isinstance(call.func, ast.Name) and call.func.id == "setattr" and len(call.args) == 3
              and isinstance(call.args[0], ast.Name) and call.args[0].id == self_name):
            name = _name_of(call.args[1], env)
        if name:
            return [(name, None)]
    return []


def _count_key(value: ast.expr, params: set[str], rebound: set[str], self_name: str) -> str | None:
    """KEY when value is `ModuleList([... for _ in range(KEY)])` with KEY a config entry, else None."""
    if not (isinstance(value, ast.Call) and len(value.args) == 1 and not value.keywords):
        return None
    func, comp = value.func, value.args[0]
    func_name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if func_name != "ModuleList" or not isinstance(comp, ast.ListComp | ast.GeneratorExp):
        return None
    if len(comp.generators) != 1 or comp.generators[0].ifs or comp.generators[0].is_async:
        return None
    rng = comp.generators[0].iter
    if not (isinstance(rng, ast.Call) and isinstance(rng.func, ast.Name) and rng.func.id == "range"
            and not rng.keywords and 1 <= len(rng.args) <= 2):
        return None
    if len(rng.args) == 2 and not (isinstance(rng.args[0], ast.Constant) and rng.args[0].value == 0):
        return None
    expr = rng.args[-1]
    if isinstance(expr, ast.Name) and expr.id in params and expr.id not in rebound:
        return expr.id  # an __init__ argument: register_to_config stores it as config[KEY]
    if isinstance(expr, ast.Attribute) and (_self_attr(expr.value, self_name) == "config" or (
            isinstance(expr.value, ast.Name) and expr.value.id == "config" and "config" not in params)):
        return expr.attr
    return None

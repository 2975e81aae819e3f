"""Find a class statement in an installed package's source text, without importing anything.

Importing diffusers takes seconds and runs its code; discovery only needs to read where a class is
defined. Re-exports are followed the way the package's own lazy modules resolve them (`from .x
import Name`, the `_import_structure` tables, `Name = Other` aliases), dummy placeholders are
skipped, and nothing outside the installed package's folder is opened.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

MAX_HOPS = 10  # re-exports, base classes and nested helper calls followed before giving up


@dataclass(frozen=True, slots=True)
class SourceModule:
    name: str  # dotted, e.g. diffusers.models.transformers.transformer_flux
    path: Path
    is_package: bool


@functools.cache
def package_root(package: str) -> Path | None:
    """Where an installed package lives (found by its spec; none of its code runs)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def locate(dotted: str) -> SourceModule | None:
    """The source file of an installed module (`pkg.sub.mod`), without importing it."""
    parts = dotted.split(".")
    root = package_root(parts[0])
    if root is None or not all(p.isidentifier() for p in parts):
        return None
    base = root.joinpath(*parts[1:])
    if (base / "__init__.py").is_file():
        return SourceModule(dotted, base / "__init__.py", True)
    if len(parts) > 1 and base.with_suffix(".py").is_file():
        return SourceModule(dotted, base.with_suffix(".py"), False)
    return None


@functools.lru_cache(maxsize=64)
def parse_source(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None


def module_level(statements: list[ast.stmt]) -> list[ast.stmt]:
    """Module-level statements, including those inside `if`/`try` blocks (not inside defs)."""
    out: list[ast.stmt] = []
    for node in statements:
        out.append(node)
        if isinstance(node, ast.If):
            out += module_level(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            out += module_level(node.body + node.orelse + node.finalbody)
            for handler in node.handlers:
                out += module_level(handler.body)
    return out


def _import_source(module: SourceModule, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    package = module.name.split(".")
    drop = node.level - 1 if module.is_package else node.level
    if drop >= len(package):
        return None
    return ".".join(package[: len(package) - drop] + ([node.module] if node.module else []))


def _strings(node: ast.expr | None) -> list[str]:
    items = node.elts if isinstance(node, ast.List | ast.Tuple | ast.Set) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def _table_key(node: ast.expr) -> str | None:
    if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "_import_structure"
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
        return node.slice.value
    return None


@functools.cache
def import_table(path: Path) -> dict[str, tuple[str, ...]]:
    """name -> submodules (in file order) from a package `__init__.py`'s `_import_structure`, the table
    diffusers' and transformers' lazy modules read; dummy placeholders are skipped."""
    tree = parse_source(path)
    table: dict[str, tuple[str, ...]] = {}

    def add(key: str | None, value: ast.expr | None) -> None:
        if key and "dummy" not in key:
            for name in _strings(value):
                if key not in table.get(name, ()):
                    table[name] = (*table.get(name, ()), key)

    for node in module_level(tree.body) if tree else []:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == "_import_structure" and isinstance(node.value, ast.Dict):
                for k, v in zip(node.value.keys, node.value.values, strict=True):
                    add(k.value if isinstance(k, ast.Constant) and isinstance(k.value, str) else None, v)
            else:
                add(_table_key(target), node.value)
        elif isinstance(node, ast.AugAssign):
            add(_table_key(node.target), node.value)
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            func = node.value.func
            if isinstance(func, ast.Attribute) and func.attr in ("append", "extend"):
                for arg in node.value.args:
                    add(_table_key(func.value), arg)
    return table


def class_statement(module: SourceModule, name: str, hops: int) -> tuple[SourceModule, ast.ClassDef] | None:
    """Follow re-exports (`from X import name`, lazy tables, `Name = Other` aliases) to a class statement,
    skipping diffusers' dummy placeholders."""
    tree = parse_source(module.path)
    if tree is None or hops > MAX_HOPS:
        return None
    statements = module_level(tree.body)
    for node in statements:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for node in statements:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = _import_source(module, node)
                    target = locate(source) if source and "dummy" not in source else None
                    if target and (found := class_statement(target, alias.name, hops + 1)):
                        return found
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and node.targets[0].id == name and isinstance(node.value, ast.Name)
              and (found := class_statement(module, node.value.id, hops + 1))):
            return found
    for key in import_table(module.path).get(name, ()) if module.is_package else ():
        target = locate(f"{module.name}.{key}")
        if target and (found := class_statement(target, name, hops + 1)):
            return found
    return None

"""Optional packages a pipeline's or a component's code uses without checking for them: refused before load.

diffusers binds some names only when an optional package is installed (`if is_ftfy_available(): import ftfy`,
`if is_torchvision_available(): from .processor_omnigen import OmniGenMultiModalProcessor`), or binds a
stand-in that raises when it is built (`else: class CosmosSafetyChecker: ...`), and then uses the name without
asking again. Without the package plain diffusers fails after every weight has loaded: PRX, Wan image-to-video
and SkyReels-V2 call `ftfy.fix_text` on every prompt, OmniGen builds its processor in `__init__`, Cosmos builds
its guardrail there and its transformer resizes a mask with torchvision in every forward. Others (Wan, PixArt,
Sana) ask `is_ftfy_available()` again where they use it and run without it.

Told apart from each module's source (`ast`, the installed diffusers' own file): a name bound under a
module-level `if is_<package>_available():`, used inside a function of a module that asks
`is_<package>_available()` in none of its functions. The modules read are the pipeline's and those of its
diffusers component classes. Whether the package is there is the module's own binding of the name (so a
test's stand-in counts): missing, or diffusers' raising stand-in.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..model_dir.trusted_classes import component_class, pipeline_class

PIP_NAMES = {"bs4": "beautifulsoup4", "opencv": "opencv-python", "invisible_watermark": "invisible-watermark"}
"""`is_<name>_available` -> the package to install, where the two differ."""
NOT_NEEDED = frozenset({"torch_xla", "torch_npu", "xformers", "onnx", "flax", "note_seq"})
"""Packages of other devices, backends or deprecated pipelines: never a need on this engine's path."""
_AVAILABLE = re.compile(r"is_(\w+)_available")


@dataclass(frozen=True, slots=True)
class GatedName:
    """A module-level name bound only when `package` is installed; `stand_in`: diffusers binds a raising stub
    (an `else:` branch) when it is not."""

    name: str
    package: str
    stand_in: bool


def _gate(node: ast.stmt) -> str | None:
    """The package of a module-level `if is_<package>_available():`."""
    if isinstance(node, ast.If) and isinstance(node.test, ast.Call) and isinstance(node.test.func, ast.Name):
        match = _AVAILABLE.fullmatch(node.test.func.id)
        return match[1] if match else None
    return None


def _bound(statements: list[ast.stmt]) -> set[str]:
    """Names that statements bind at module level (imports, classes, functions, plain assignments)."""
    names: set[str] = set()
    for stmt in statements:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in stmt.names)
        elif isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return names


@functools.cache
def _unguarded_names(path: Path) -> tuple[GatedName, ...]:
    """The gated names that functions of the module at `path` use with no availability check of their package."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return ()
    gated: dict[str, GatedName] = {}
    for node in tree.body:
        package = _gate(node)
        if package is None or package in NOT_NEEDED:
            continue
        stand_ins = _bound(node.orelse)  # type: ignore[attr-defined]
        for name in _bound(node.body):  # type: ignore[attr-defined]
            gated[name] = GatedName(name, package, name in stand_ins)
    used: set[str] = set()
    checked: set[str] = set()
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for node in ast.walk(function):
            if isinstance(node, ast.Name) and node.id in gated and isinstance(node.ctx, ast.Load):
                used.add(node.id)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                match = _AVAILABLE.fullmatch(node.func.id)
                if match:
                    checked.add(match[1])
    return tuple(gated[name] for name in sorted(used) if gated[name].package not in checked)


def _missing(module: object, gated: GatedName) -> bool:
    """Whether the module's binding of the name is absent, or the raising stand-in diffusers binds without it."""
    bound = getattr(module, gated.name, None)
    if bound is None:
        return True
    return gated.stand_in and getattr(bound, "__module__", None) == getattr(module, "__name__", None)


def _refusal(owner: str, gated: GatedName) -> str:
    package = PIP_NAMES.get(gated.package, gated.package)
    if gated.name == gated.package == "ftfy":
        what = "cleans every prompt with ftfy, which is not installed"
    else:
        what = f"uses {gated.name}, which needs {package}: not installed"
    return f"{owner} {what} (pip install {package}); plain diffusers fails alike, after loading"


def _modules(model: ModelInfo) -> list[tuple[str, type]]:
    """(who, class) for the pipeline and each of its diffusers component classes."""
    found = [(model.pipeline_class, pipeline_class(model.pipeline_class, "model_index.json"))]
    for component in model.components:
        if component.library in ("transformers", None) or not component.class_name:
            continue
        cls = component_class(component.library, component.class_name, component.name)
        found.append((f"{component.name} ({component.class_name})", cls))
    return found


def check_pipeline_needs(model: ModelInfo) -> None:
    """Refuse, in one line, a pipeline whose code, or whose diffusers components' code, uses an optional package
    that is not installed without asking for it, or a transformers processor component that cannot be built
    without one (Kandinsky 5's Qwen2-VL processor needs torchvision for its video processor:
    `missing_backends.processor_missing`)."""
    for component in model.components:  # only processors: other classes are imported by the load itself
        if component.library == "transformers" and (component.class_name or "").endswith("Processor"):
            component_class(component.library, component.class_name, f"{component.name}")
    for owner, cls in _modules(model):
        module = sys.modules.get(cls.__module__)
        try:
            source = inspect.getsourcefile(cls) if module is not None else None
        except TypeError:  # a built-in class
            source = None
        if source is None:
            continue
        for gated in _unguarded_names(Path(source)):
            if _missing(module, gated):
                raise ConfigError(_refusal(owner, gated))

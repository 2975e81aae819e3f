"""Optional packages a pipeline's code calls on every prompt without checking for them: refused before load.

Some diffusers pipelines import an optional package only when it is installed (`if is_ftfy_available():
import ftfy` at module level) and then call it from their prompt cleaning without asking again (PRX,
Wan image-to-video and VACE, SkyReels-V2: `ftfy.fix_text`). Without the package plain diffusers fails
with a `NameError` after every weight has loaded. Others (Wan, PixArt, Sana) ask `is_ftfy_available()`
again where they use it and run without it.

Told apart from the pipeline module's source (`ast`, the installed diffusers' own file): a use of the
package's name inside a function of a module that asks `is_<name>_available()` in none of its functions.
Whether the package is there is the module's own binding of the name (so a test's stand-in counts).
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
from pathlib import Path

from ..errors import ConfigError
from ..model_dir.discovery import ModelInfo
from ..model_dir.trusted_classes import component_class, pipeline_class

OPTIONAL_PACKAGES = {"ftfy": "ftfy"}
"""Module-level name a pipeline binds only when installed -> the package to install."""


@functools.cache
def _unguarded_names(path: Path) -> frozenset[str]:
    """The `OPTIONAL_PACKAGES` names that functions of the module at `path` use with no availability check."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return frozenset()
    used: set[str] = set()
    checked: set[str] = set()
    for function in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)):
        for node in ast.walk(function):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in OPTIONAL_PACKAGES:
                used.add(node.value.id)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                checked.update(name for name in OPTIONAL_PACKAGES if node.func.id == f"is_{name}_available")
    return frozenset(used - checked)


def check_pipeline_needs(model: ModelInfo) -> None:
    """Refuse, in one line, a pipeline whose prompt cleaning calls an optional package that is not installed,
    or a transformers processor component that cannot be built without one (Kandinsky 5's Qwen2-VL
    processor needs torchvision for its video processor: `missing_backends.processor_missing`)."""
    for component in model.components:  # only processors: other classes are imported by the load itself
        if component.library == "transformers" and (component.class_name or "").endswith("Processor"):
            component_class(component.library, component.class_name, f"{component.name}")
    cls = pipeline_class(model.pipeline_class, "model_index.json")
    module = sys.modules.get(cls.__module__)
    source = inspect.getsourcefile(cls) if module is not None else None
    if source is None:
        return
    for name in sorted(_unguarded_names(Path(source))):
        if getattr(module, name, None) is None:
            package = OPTIONAL_PACKAGES[name]
            raise ConfigError(f"{model.pipeline_class} cleans every prompt with {package}, which is not installed "
                              f"(pip install {package}); plain diffusers fails alike, after loading")

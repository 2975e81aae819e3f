"""What kind of class `diffusers.X` or `transformers.X` is, read from the installed packages' files.

Importing diffusers and transformers to check a model directory's class names costs seconds (both
pull in torch), and `plan` only reads headers. Both packages list their exports in lazy-import
tables that they themselves read before importing anything: diffusers' `_import_structure` dicts
in each package `__init__.py`, transformers' top-level `_import_structure` plus one `__all__` per
file under `models/<name>/`. This module reads those tables and the defining class's source with
`ast` (nothing is imported or run, nothing outside the installed package is opened), then follows
the class's bases by name to tell a pipeline from a model, scheduler, tokenizer or processor.

The loader still imports the real class at load time and checks it again (`trusted_classes`).
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from .class_index_cache import remembered
from .installed_source import (
    SourceModule,
    class_statement,
    import_table,
    locate,
    module_level,
    package_root,
    parse_source,
)

Kind = Literal["pipeline", "modular", "weights", "loadable", "other"]  # modular: a ModularPipeline (no from_pretrained
# of a model folder as `run` builds one), refused as a model's pipeline and as a component

_MAX_BASE_LEVELS = 10

PIPELINE_BASES = frozenset({"DiffusionPipeline", "ModularPipeline", "ModularPipelineBlocks"})
WEIGHT_BASES = {"diffusers": frozenset({"ModelMixin", "AutoModel"}),
                "transformers": frozenset({"PreTrainedModel", "_BaseAutoModelClass"})}
# a class diffusers defines in one of its pipeline packages (SD's safety checker is a transformers model)
WEIGHT_BASES["pipelines"] = WEIGHT_BASES["diffusers"] | {"PreTrainedModel"}
LOADABLE_BASES = {"diffusers": frozenset({"SchedulerMixin", "BaseGuidance"}),  # a guider: a config, no weights
                  # the documented bases, and the intermediate ones every tokenizer/processor derives from
                  "transformers": frozenset({"PreTrainedTokenizerBase", "ProcessorMixin", "ImageProcessingMixin",
                                             "FeatureExtractionMixin", "BaseVideoProcessor", "PreTrainedTokenizer",
                                             "PreTrainedTokenizerFast", "TokenizersBackend", "SentencePieceBackend",
                                             "PythonBackend", "BaseImageProcessor", "TorchvisionBackend", "PilBackend",
                                             "SequenceFeatureExtractor"})}
LOADABLE_BASES["pipelines"] = LOADABLE_BASES["diffusers"] | LOADABLE_BASES["transformers"]
_ALL = re.compile(r"^__all__\s*=\s*(\[[^\]]*\])", re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ClassRef:
    """A class an installed package defines: where, and what it can load."""

    library: str
    name: str
    module: str  # dotted name of the defining module
    kind: Kind
    is_class: bool = True


@functools.cache
def _file_exports(folder: Path) -> dict[str, str]:
    """name -> module file stem, from the `__all__` of each file in a transformers model folder."""
    table: dict[str, str] = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith(("modular_", "convert_", "__")):
            continue
        try:
            match = _ALL.search(path.read_text(encoding="utf-8"))
            names = ast.literal_eval(match.group(1)) if match else []
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        for name in names if isinstance(names, list) else []:
            if isinstance(name, str):
                table.setdefault(name, path.stem)
    return table


@functools.cache
def _model_folders() -> tuple[tuple[str, str], ...]:
    """transformers' model folders as (squashed lower-case name, folder name), e.g. ('qwen25vl', 'qwen2_5_vl')."""
    root = package_root("transformers")
    models = root / "models" if root else None
    if models is None or not models.is_dir():
        return ()
    return tuple((p.name.replace("_", "").lower(), p.name) for p in sorted(models.iterdir())
                 if p.is_dir() and (p / "__init__.py").is_file())


def _exporting_module(library: str, name: str) -> str | None:
    """The dotted module the package's lazy tables name for `name` (None: the package does not export it)."""
    root = package_root(library)
    if root is None:
        return None
    keys = import_table(root / "__init__.py").get(name)
    if keys:
        return f"{library}.{keys[0]}"
    if library != "transformers":
        return None
    squashed = name.replace("_", "").lower()
    for prefix, folder in _model_folders():  # CLIPTextModel lives in models/clip, Qwen2_5_VL… in models/qwen2_5_vl
        if squashed.startswith(prefix) and (stem := _file_exports(root / "models" / folder).get(name)):
            return f"transformers.models.{folder}.{stem}"
    for _, folder in _model_folders():  # the few named otherwise (ASTModel in audio_spectrogram_transformer)
        if stem := _file_exports(root / "models" / folder).get(name):
            return f"transformers.models.{folder}.{stem}"
    return None


def _direct_bases(cls: ast.ClassDef) -> list[tuple[str, bool]]:
    """(name, resolvable) per base: `Other` can be followed in source, `nn.Module` only named."""
    out = []
    for base in cls.bases:
        if isinstance(base, ast.Name):
            out.append((base.id, True))
        elif isinstance(base, ast.Attribute):
            out.append((base.attr, False))
    return out


def _kind(library: str, module: str, bases: set[str]) -> Kind:
    if bases & PIPELINE_BASES:
        return "pipeline" if "DiffusionPipeline" in bases else "modular"
    if bases & WEIGHT_BASES[library]:
        return "weights"
    if bases & LOADABLE_BASES[library]:
        return "loadable"
    if library == "transformers" and module.startswith("transformers.models.auto."):
        return "loadable"  # AutoTokenizer, AutoProcessor…: plain classes that pick a loadable one
    return "other"


def _kind_of(library: str, module: SourceModule, cls: ast.ClassDef) -> Kind:
    """Walk the bases breadth first and stop at the first level naming a known root (fewest files parsed)."""
    seen = {cls.name}
    level = [(module, cls)]
    for _ in range(_MAX_BASE_LEVELS):
        names = set().union(*(({c.name} | {n for n, _ in _direct_bases(c)}) for _, c in level))
        kind = _kind(library, module.name, names)
        if kind != "other" or not level:
            return kind
        following = []
        for where, c in level:
            for name, resolvable in _direct_bases(c):
                if resolvable and name not in seen and (found := class_statement(where, name, 0)):
                    seen.add(name)
                    following.append(found)
        level = following
    return "other"


def _ref_to_json(ref: ClassRef | None) -> dict | None:
    return None if ref is None else {"module": ref.module, "kind": ref.kind, "is_class": ref.is_class}


def _ref_from_json(library: str, name: str, value: dict | None) -> ClassRef | None:
    return None if value is None else ClassRef(library, name, value["module"], value["kind"], value["is_class"])


@functools.cache
def find_class(library: str, name: str) -> ClassRef | None:
    """The class `library.name` as the installed package's tables define it; None when it is no class there.

    A `…Fast` name the package does not list resolves to the class without the suffix, as transformers'
    own lazy module does (`T5TokenizerFast` is `T5Tokenizer` in transformers 5). Answers are kept across
    processes per installed package (`class_index_cache`).
    """
    if not name.isidentifier() or name.startswith("_"):
        return None
    return _ref_from_json(library, name, remembered("find", library, name,
                                                    lambda: _ref_to_json(_find_class(library, name)),
                                                    lambda cached: _confirms(library, name, cached)))


def _confirms(library: str, name: str, cached: dict | None) -> bool:
    """Whether a cached answer holds in the installed source: the module it names defines `name` there with the
    kind its bases give (a class), or names `name` at all (an export that is no class). A cached "no" stands
    (it only refuses)."""
    if cached is None:
        return True
    module = locate(cached["module"])
    if module is None:
        return False
    found = class_statement(module, name, 0)
    if found is None and name.endswith("Fast"):  # T5TokenizerFast is T5Tokenizer in transformers 5 (`find_class`)
        found = class_statement(module, name[: -len("Fast")], 0)
    if not cached["is_class"]:
        return found is None and re.search(rf"\b{re.escape(name)}\b", _text(module.path)) is not None
    return (found is not None and found[0].name == cached["module"]
            and _kind_of(library, found[0], found[1]) == cached["kind"])


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def _find_class(library: str, name: str) -> ClassRef | None:
    dotted = _exporting_module(library, name)
    if dotted is None:
        return find_class(library, name[: -len("Fast")]) if name.endswith("Fast") else None
    module = locate(dotted)
    found = class_statement(module, name, 0) if module else None
    if found is None:
        return ClassRef(library, name, dotted, "other", is_class=False) if module else None
    where, cls = found
    return ClassRef(library, name, where.name, _kind_of(library, where, cls))


def pipeline_package(library: str) -> SourceModule | None:
    """`diffusers.pipelines.<library>` when the installed diffusers has that pipeline package (the
    "library" of a hub entry such as `["stable_diffusion", "StableDiffusionSafetyChecker"]`)."""
    if not library.isidentifier() or library.startswith("_"):
        return None
    module = locate(f"diffusers.pipelines.{library}")
    return module if module is not None and module.is_package else None


@functools.cache
def find_pipeline_package_class(library: str, name: str) -> ClassRef | None:
    """The class `name` as `diffusers.pipelines.<library>` exports it, when diffusers itself defines it there.

    diffusers' own loader resolves such an entry with `getattr(diffusers.pipelines.<library>, name)`;
    a name re-exported from elsewhere (another package, another pipeline) is not accepted."""
    if pipeline_package(library) is None or not name.isidentifier() or name.startswith("_"):
        return None
    return _ref_from_json(library, name, remembered("package_class", library, name,
                                                    lambda: _ref_to_json(_find_package_class(library, name)),
                                                    lambda cached: _confirms("pipelines", name, cached)))


def _find_package_class(library: str, name: str) -> ClassRef | None:
    package = pipeline_package(library)
    if package is None:
        return None
    found = class_statement(package, name, 0)
    if found is None or not (found[0].name == package.name or found[0].name.startswith(package.name + ".")):
        return None
    where, cls = found
    return ClassRef(library, name, where.name, _kind_of("pipelines", where, cls))


def reexports_transformers_class(library: str, name: str) -> bool:
    """Whether `diffusers.pipelines.<library>` re-exports transformers' own class `name` (GLM-Image's package
    imports `GlmImageProcessor` from transformers so that `["glm_image", "GlmImageProcessor"]`, which diffusers'
    `save_pretrained` writes for it, resolves). diffusers' loader then builds that transformers class."""
    package = pipeline_package(library)
    if package is None or not name.isidentifier() or name.startswith("_"):
        return False
    tree = parse_source(package.path)
    imported = tree is not None and any(
        isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "transformers"
        and any(alias.name == name and alias.asname is None for alias in node.names)
        for node in module_level(tree.body))
    return imported and exports("transformers", name)


def exports(library: str, name: str) -> bool:
    """Whether the installed package exports `name` at top level (class or not; a `…Fast` alias counts)."""
    if not name.isidentifier() or name.startswith("_"):
        return False
    return bool(remembered("exports", library, name, lambda: _exports(library, name),
                           lambda cached: not cached or find_class(library, name) is not None
                           or (name.endswith("Fast") and find_class(library, name[: -len("Fast")]) is not None)))


def _exports(library: str, name: str) -> bool:
    if _exporting_module(library, name) is not None:
        return True
    return name.endswith("Fast") and _exporting_module(library, name[: -len("Fast")]) is not None

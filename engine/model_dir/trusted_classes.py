"""Which classes a model directory may name: only those the installed diffusers/transformers define.

A `model_index.json` entry `[library, class]` and the class references inside config files decide
what code runs when a model loads. Code shipped in the directory itself (`auto_map`, a custom
pipeline module, a library name that is really a `.py` file) must never run, so:

- a component's library is `diffusers` or `transformers`, and its class is one that package
  defines and can load from a folder: a diffusers model, scheduler or guider (a config, no
  weights: HunyuanVideo 1.5's `ClassifierFreeGuidance`), or `AutoModel`, a
  transformers model, tokenizer, processor, image processor or feature extractor (or an `Auto*`);
- a component that is itself a pipeline (a nested pipeline) is refused: loading it would read a
  second `model_index.json` and build its own components outside this engine's checks;
- the pipeline class (`_class_name` of `model_index.json`) is a diffusers `DiffusionPipeline`;
- a "library" naming one of diffusers' own pipeline packages (the hub's SD1.5 saves its safety
  checker as `["stable_diffusion", "StableDiffusionSafetyChecker"]`, which diffusers loads from
  `diffusers.pipelines.stable_diffusion`) is accepted for a model class that package itself defines,
  as `DiffusionPipeline.from_pretrained` resolves it; transformers' own class that the package re-exports
  (diffusers' `save_pretrained` writes GLM-Image's processor as `["glm_image", "GlmImageProcessor"]`) is
  loaded as that transformers class; anything else it re-exports from elsewhere is not;
- a few transformers names that transformers itself does not export are ones a diffusers pipeline
  package defines and registers there (`REGISTERED_BY_PIPELINES`: diffusers' prx package sets
  `transformers.T5GemmaEncoder` to its own wrapper, which PRX checkpoints name): they resolve to that
  diffusers class, as diffusers' loader resolves them, never to anything the directory ships.

Discovery (`check_component`, `check_pipeline`) decides from the installed packages' lazy-import
tables and source (`class_index`), without importing either library; the loader
(`component_class`, `pipeline_class`) runs the same checks, then imports the real class and checks
it again.
"""

from __future__ import annotations

import importlib
import re

from ..errors import ModelDirError
from .class_index import (
    ClassRef,
    exports,
    find_class,
    find_pipeline_package_class,
    pipeline_package,
    reexports_transformers_class,
)
from .missing_backends import error_reason, missing_backends, processor_missing

ALLOWED_LIBRARIES = ("diffusers", "transformers")
REGISTERED_BY_PIPELINES = {("transformers", "T5GemmaEncoder"): "prx"}
"""(library, name) -> the diffusers pipeline package that defines the class and registers it under that name."""
_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_NO_CODE = "custom code is never run"


def _check_library(library: object, where: str) -> str:
    if library not in ALLOWED_LIBRARIES:
        raise ModelDirError(f"{where}: library {library!r:.60} is not allowed (only {' and '.join(ALLOWED_LIBRARIES)} "
                            f"classes are built; {_NO_CODE})")
    return str(library)


def _library(library: object, where: str):
    return importlib.import_module(_check_library(library, where))


def library_defines(library: str, name: object) -> bool:
    """True when `name` is a name the installed package exports (a `…Fast` alias of one counts too)."""
    return isinstance(name, str) and bool(_IDENTIFIER.match(name)) and exports(library, name)


def is_pipeline_package(library: object) -> bool:
    """A "library" that is one of the installed diffusers' pipeline packages (read from its files)."""
    return isinstance(library, str) and library not in ALLOWED_LIBRARIES and pipeline_package(library) is not None


def _registering_package(library: object, class_name: object) -> str | None:
    """The diffusers pipeline package that provides `library.class_name`, where the library itself does not."""
    if not (isinstance(library, str) and isinstance(class_name, str)):  # JSON may hold anything (a list: unhashable)
        return None
    package = REGISTERED_BY_PIPELINES.get((library, class_name))
    return package if package is not None and not library_defines(str(library), class_name) else None


def transformers_alias(library: object, class_name: object) -> bool:
    """A pipeline-package entry that names transformers' own class, which the package re-exports: loaded as
    `["transformers", class_name]`, as diffusers' loader resolves it to that very class."""
    return (isinstance(library, str) and isinstance(class_name, str) and is_pipeline_package(library)
            and reexports_transformers_class(library, class_name))


def _find(library: object, class_name: object, where: str) -> ClassRef:
    if (package := _registering_package(library, class_name)) is not None:
        library = package
    if is_pipeline_package(library):
        ref = find_pipeline_package_class(str(library), class_name) if isinstance(class_name, str) else None
        if ref is None and transformers_alias(library, class_name):
            return _find("transformers", class_name, where)
        if ref is None:
            raise ModelDirError(f"{where}: diffusers.pipelines.{library} defines no class {class_name!r:.60} "
                                f"({_NO_CODE})")
        return ref
    library = _check_library(library, where)
    if not library_defines(library, class_name):
        raise ModelDirError(f"{where}: {library} has no class {class_name!r:.60} ({_NO_CODE})")
    ref = find_class(library, str(class_name))
    if ref is None or not ref.is_class:
        raise ModelDirError(f"{where}: {library}.{class_name} is not a {library} class ({_NO_CODE})")
    return ref


def check_component(library: object, class_name: object, where: str) -> ClassRef:
    """The class a component declares, refused unless the installed library defines it and it loads a folder.

    Decided from the installed packages' files; nothing is imported.
    """
    ref = _find(library, class_name, where)
    if ref.kind in ("pipeline", "modular"):
        raise ModelDirError(f"{where}: {library}.{class_name} is a pipeline; nested pipelines are refused "
                            "(a component must be a model, scheduler, guider, tokenizer or processor)")
    if ref.kind == "other":
        raise ModelDirError(f"{where}: {library}.{class_name} is not a model, scheduler, guider, tokenizer or "
                            "processor class (only those are loaded from a component folder)")
    return ref


def check_pipeline(class_name: object, where: str) -> ClassRef:
    """The diffusers pipeline a `model_index.json` names, refused unless diffusers defines it (nothing imported)."""
    ref = _find("diffusers", class_name, where)
    if ref.kind != "pipeline":
        raise ModelDirError(f"{where}: '_class_name' {class_name!r} is not a diffusers pipeline ({_NO_CODE})")
    return ref


def _import_pipeline_package_class(library: str, class_name: str, where: str) -> type:
    """`getattr(diffusers.pipelines.<library>, class_name)`, as diffusers' loader does, checked to be defined
    in that package (after `_find` read the same from its source)."""
    package = f"diffusers.pipelines.{library}"
    try:
        cls = getattr(importlib.import_module(package), class_name)
    except Exception as exc:
        raise ModelDirError(f"{where}: {package}.{class_name} cannot be imported ({error_reason(exc)})") from None
    _refuse_stand_in(cls, "diffusers", f"{package}.{class_name}", where)
    if not isinstance(cls, type) or not (cls.__module__ == package or cls.__module__.startswith(package + ".")):
        raise ModelDirError(f"{where}: {package}.{class_name} is not a diffusers class ({_NO_CODE})")
    return cls


def _refuse_stand_in(cls: object, library: str, name: str, where: str) -> None:
    """A library's stand-in for a class whose optional package is missing: refused, naming the package."""
    missing = missing_backends(cls, library)
    if missing is not None:
        raise ModelDirError(f"{where}: {name} needs {', '.join(missing)}, which is not installed "
                            f"(without it {library} gives only a placeholder class)")


def _import_class(library: object, class_name: object, where: str) -> type:
    if (package := _registering_package(library, class_name)) is not None:
        return _import_pipeline_package_class(package, str(class_name), where)
    if transformers_alias(library, class_name):
        library = "transformers"
    elif is_pipeline_package(library):
        return _import_pipeline_package_class(str(library), str(class_name), where)
    module = _library(library, where)
    library = module.__name__
    if not library_defines(library, class_name):
        raise ModelDirError(f"{where}: {library} has no class {class_name!r:.60} ({_NO_CODE})")
    try:
        cls = getattr(module, class_name)
    except Exception as exc:  # a lazy import failing (a missing optional dependency) is a refusal, not a crash
        raise ModelDirError(f"{where}: {library}.{class_name} cannot be imported ({error_reason(exc)})") from None
    _refuse_stand_in(cls, library, f"{library}.{class_name}", where)
    if not isinstance(cls, type) or not (cls.__module__ == library or cls.__module__.startswith(library + ".")):
        raise ModelDirError(f"{where}: {library}.{class_name} is not a {library} class ({_NO_CODE})")
    if library == "transformers" and (part := processor_missing(cls)) is not None:
        raise ModelDirError(f"{where}: {library}.{class_name} needs {', '.join(part[1])} for its {part[0]}, "
                            "which is not installed (transformers cannot build it without it; plain diffusers fails "
                            "alike)")
    return cls


def _is_pipeline(cls: type) -> bool:
    import diffusers

    bases = tuple(getattr(diffusers, n) for n in ("DiffusionPipeline", "ModularPipeline", "ModularPipelineBlocks")
                  if isinstance(getattr(diffusers, n, None), type))
    return issubclass(cls, bases)


def _loadable_bases(library: str) -> tuple[type, ...]:
    if library not in ALLOWED_LIBRARIES:  # a diffusers pipeline package: diffusers' or transformers' kinds
        return _loadable_bases("diffusers") + _loadable_bases("transformers")
    module = importlib.import_module(library)
    names = (("ModelMixin", "SchedulerMixin", "BaseGuidance", "AutoModel") if library == "diffusers" else
             ("PreTrainedModel", "PreTrainedTokenizerBase", "ProcessorMixin", "ImageProcessingMixin",
              "FeatureExtractionMixin", "BaseVideoProcessor"))
    return tuple(c for n in names if isinstance(c := getattr(module, n, None), type))


def _is_transformers_auto(cls: type) -> bool:
    return cls.__module__.startswith("transformers.models.auto.") and cls.__name__.startswith("Auto")


def component_class(library: object, class_name: object, where: str) -> type:
    """The imported class a component declares: `check_component`, then the same rules on the real class."""
    check_component(library, class_name, where)
    cls = _import_class(library, class_name, where)
    if _is_pipeline(cls):
        raise ModelDirError(f"{where}: {library}.{class_name} is a pipeline; nested pipelines are refused "
                            "(a component must be a model, scheduler, guider, tokenizer or processor)")
    auto = library == "transformers" and _is_transformers_auto(cls)
    if not (auto or issubclass(cls, _loadable_bases(str(library)))):
        raise ModelDirError(f"{where}: {library}.{class_name} is not a model, scheduler, guider, tokenizer or "
                            "processor class (only those are loaded from a component folder)")
    return cls


def pipeline_class(class_name: object, where: str) -> type:
    """The imported diffusers pipeline a `model_index.json` names: `check_pipeline`, then checked as a class."""
    import diffusers

    check_pipeline(class_name, where)
    cls = _import_class("diffusers", class_name, where)
    if not issubclass(cls, diffusers.DiffusionPipeline):
        raise ModelDirError(f"{where}: '_class_name' {class_name!r} is not a diffusers pipeline ({_NO_CODE})")
    return cls


def accepts_trust_remote_code(library: str | None, cls: type) -> bool:
    """Whether `cls.from_pretrained` takes `trust_remote_code` (every transformers class; diffusers' AutoModel)."""
    if library == "transformers":
        return True
    if library not in ALLOWED_LIBRARIES:  # a transformers model diffusers defines (SD's safety checker)
        from transformers import PreTrainedModel

        return issubclass(cls, PreTrainedModel)
    import diffusers

    return cls is getattr(diffusers, "AutoModel", None)


def holds_weights(cls: type) -> bool:
    """A class that loads weight files: a torch module, or an `Auto*` model class that builds one."""
    import torch

    if issubclass(cls, torch.nn.Module):
        return True
    import diffusers
    from transformers.models.auto.auto_factory import _BaseAutoModelClass

    return issubclass(cls, _BaseAutoModelClass) or cls is getattr(diffusers, "AutoModel", None)

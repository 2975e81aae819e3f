"""Why a library class cannot be used here, named: the missing package, never an empty reason.

diffusers and transformers export a stand-in ("dummy") class when an optional package is missing
(ConsisID without OpenCV): it imports fine and fails only when built, with a message that starts
with a blank line. A refusal must name what is missing, before anything loads.
"""

from __future__ import annotations

import importlib

# What to install for a backend name diffusers/transformers use in their dummy classes.
BACKEND_PACKAGES = {"opencv": "OpenCV (pip install opencv-python)", "sentencepiece": "sentencepiece",
                    "scipy": "scipy", "torchsde": "torchsde", "librosa": "librosa", "onnx": "onnx",
                    "note_seq": "note-seq", "ftfy": "ftfy", "imageio": "imageio", "bs4": "beautifulsoup4",
                    "torchvision": "torchvision (pip install torchvision)", "vision": "Pillow"}
_MAX_REASON = 120


def error_reason(exc: BaseException) -> str:
    """The first non-blank line of an exception's message (library messages often start with a newline),
    else its type's name: never empty."""
    line = next((text.strip() for text in str(exc).splitlines() if text.strip()), "")
    return line[:_MAX_REASON] if line else type(exc).__name__


def _is_dummy(cls: object) -> bool:
    return type(cls).__name__ == "DummyObject" and isinstance(getattr(cls, "_backends", None), list | tuple)


def _available(library: str, backend: str) -> bool | None:
    """Whether the library says `backend` is installed (None: it does not know the name)."""
    try:
        mapping = importlib.import_module(f"{library}.utils.import_utils").BACKENDS_MAPPING
        check = mapping[backend][0]
    except (ImportError, AttributeError, KeyError, IndexError, TypeError):
        return None
    try:
        return bool(check())
    except Exception:  # a broken check: treat as missing, the class is a stand-in anyway
        return False


def missing_backends(cls: object, library: str) -> list[str] | None:
    """For a library's stand-in class, what it needs that is not installed (named for the user);
    None for a real class."""
    if not _is_dummy(cls):
        return None
    backends = [str(b) for b in getattr(cls, "_backends", ())]
    missing = [b for b in backends if _available(library, b) is not True] or backends
    return [BACKEND_PACKAGES.get(b, b) for b in missing]


def processor_missing(cls: object) -> tuple[str, list[str]] | None:
    """For a transformers processor class (a tokenizer plus image, video or audio processors), the first
    part it always loads whose auto class needs a package that is not installed, and that package: a
    Qwen2-VL processor loads a video processor, which transformers builds only with torchvision, so the
    load fails with an empty `ImportError` otherwise. None: every part can be built (or not a processor)."""
    try:
        from transformers import processing_utils
    except ImportError:
        return None
    if not (isinstance(cls, type) and issubclass(cls, processing_utils.ProcessorMixin)):
        return None
    try:
        attributes = cls.get_attributes()
        names = processing_utils.MODALITY_TO_AUTOPROCESSOR_MAPPING._MAPPING_NAMES
    except Exception:  # another transformers: cannot tell, the load says
        return None
    for attribute in attributes:
        modality = next((m for m in names if m in attribute), None)
        if modality is None:
            continue
        module, name = names[modality]
        try:
            auto = getattr(importlib.import_module(module), name)
        except Exception:
            continue
        backends = [str(b) for b in getattr(auto, "_backends", None) or getattr(auto, "__backends", ()) or ()]
        missing = [b for b in backends if _available("transformers", b) is False]
        if missing:
            return attribute, [BACKEND_PACKAGES.get(b, b) for b in missing]
    return None

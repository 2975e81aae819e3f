"""Whether a diffusers pipeline makes still images, read from its `__call__` in the installed source.

`run` answers a cheap mistake, such as an `--output` that exists, before torch and diffusers are
imported (seconds). Which files a result writes depends on whether the pipeline takes a number of
frames: a still image is the output path itself, a video's frames may be a numbered sequence beside
it. The full check (`engine.running.call_options`, on the imported class) still runs before load;
this one only answers early where the source settles it, and says "not known" otherwise (an
inherited `__call__`, a class it cannot find).
"""

from __future__ import annotations

import ast

from .class_index import find_class
from .installed_source import class_statement, locate

FRAME_PARAMETERS = ("num_frames", "video_length", "frames")  # engine.running.runner's (that module imports torch)


def call_parameters(pipeline_class_name: str) -> frozenset[str] | None:
    """The parameter names of `diffusers.<name>.__call__` as its class statement defines it; None when
    the source does not say (no such pipeline class, or `__call__` inherited)."""
    ref = find_class("diffusers", pipeline_class_name)
    module = locate(ref.module) if ref is not None and ref.kind == "pipeline" else None
    found = class_statement(module, pipeline_class_name, 0) if module is not None else None
    if found is None:
        return None
    for node in found[1].body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "__call__":
            args = node.args
            return frozenset(a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs))
    return None


def makes_still_images(pipeline_class_name: str) -> bool | None:
    """True when the pipeline's `__call__` takes no number of frames, False when it does, None: not known."""
    names = call_parameters(pipeline_class_name)
    return None if names is None else not any(p in names for p in FRAME_PARAMETERS)

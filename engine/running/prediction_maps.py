"""Prediction maps (Marigold depth and surface normals) as the images diffusers' own exporters make of them.

These pipelines return `prediction`, an array, not a picture. Depth is stored as diffusers'
`export_depth_to_16bit_png` computes it (16-bit grayscale, 0..1 over 0..65535: what depth tools read back), surface
normals as `visualize_normals` colours them (x, y, z in -1..1 over 0..255), intrinsics as `visualize_intrinsics`
splits them (one image per target the model's `target_properties` names: albedo, roughness, ...), each image
carrying its target's name (`MAP_NAME`) so that the run says which numbered file is which.
"""

from __future__ import annotations

from typing import Any

PREDICTION_FIELD = "prediction"
MAP_NAME = "omni-console map"  # the key of a map image's `info` that names its target (intrinsics)
MAP_KINDS = {"MarigoldDepthPipeline": "depth", "MarigoldNormalsPipeline": "normals",
             "MarigoldIntrinsicsPipeline": "intrinsics"}
"""Pipelines whose prediction is written, by class, and the kind of map each returns."""


def map_kind(pipeline_class_name: str) -> str | None:
    """The kind of map a pipeline class predicts, where it is one written here (None: not a map pipeline)."""
    return MAP_KINDS.get(pipeline_class_name)


def prediction_frames(pipe: Any, output: Any) -> list[Any] | None:
    """The prediction of a map pipeline as PIL images, one per input image (None: not a map pipeline's output)."""
    kind = map_kind(type(pipe).__name__)
    prediction = getattr(output, PREDICTION_FIELD, None)
    if kind is None or prediction is None:
        return None
    from diffusers.pipelines.marigold.marigold_image_processing import MarigoldImageProcessor

    if kind == "depth":
        return depth_images(prediction)
    if kind == "normals":
        return MarigoldImageProcessor.visualize_normals(prediction)
    first, *_ = MarigoldImageProcessor.visualize_intrinsics(prediction, pipe.target_properties)
    for name, image in first.items():
        image.info[MAP_NAME] = name
    return list(first.values())


def depth_images(prediction: Any) -> list[Any]:
    """Depth in 0..1 ([N, H, W, 1]) as 16-bit grayscale images, the arithmetic of diffusers'
    `export_depth_to_16bit_png` (`depth * 65535`, truncated). Its own call passes `mode="I;16"` to
    `Image.fromarray`, which Pillow 13 refuses for uint16 data; Pillow infers that mode from the dtype."""
    import numpy as np
    from PIL import Image

    maps = np.asarray(prediction)
    return [Image.fromarray((one[..., 0] * (2**16 - 1)).astype(np.uint16)) for one in maps]

"""A pipeline that calls into a staged encoder's submodules itself finds its weights on the device.

Ideogram 4 never calls its Qwen3-VL encoder's forward: it runs the embedding, the rotary embedding and each
decoder layer itself. A staged encoder's weights rest on the host between stages, so on a GPU those calls met
host weights (a device mismatch), and with the encoder streamed layer by layer its layer ring was never open
(`max() arg is an empty sequence`). Such a call now stages the encoder, and it is offloaded when denoising
starts (offload/staged_calls.py `LazyStages`).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_new_families import PROMPT, plain_output
from test_sweep_families import GENERATION, build_sweep_family

from omni_console.engine.engine import Engine
from omni_console.engine.running.runner import GenerateRequest
from omni_console.offload.events import StagingEvent
from omni_console.offload.policy import build_policy


@pytest.mark.slow  # two loads and requests, and a plain pipeline call
@pytest.mark.parametrize("stream_encoders", ["off", "on"])
def test_ideogram4_encoder_layers_run_on_a_staged_encoders_loaded_weights(stream_encoders, tmp_path):
    path = build_sweep_family("ideogram4", tmp_path / "ideogram4")
    gen = dict(GENERATION["ideogram4"])
    request = GenerateRequest(prompt=PROMPT, steps=gen.pop("num_inference_steps"), height=gen.pop("height"),
                              width=gen.pop("width"), seed=7, guidance=3.0,
                              max_sequence_length=gen.pop("max_sequence_length"),
                              output_type="np", extra=gen)
    expected, _ = plain_output(path, "ideogram4", request, {})
    engine = Engine(path, device="cpu")
    try:
        engine.load(build_policy({}, 0, stream_encoders=stream_encoders))  # the text encoder staged
        stager = engine.placement.stagers["text_encoder"]
        embed = engine.pipe.text_encoder.language_model.embed_tokens
        loaded_at_embed: list[bool] = []
        embed.register_forward_pre_hook(lambda *_: loaded_at_embed.append(stager.loaded))
        loaded_at_denoise: list[bool] = []
        engine.pipe.transformer.register_forward_pre_hook(lambda *_: loaded_at_denoise.append(stager.loaded))
        sub = engine.bus.subscribe()
        result = engine.generate(request)
        staged = [e.direction for e in sub.drain() if isinstance(e, StagingEvent) and e.target == "text_encoder"]
    finally:
        engine.close()
    assert np.array_equal(np.asarray(result.image)[None], expected)
    assert loaded_at_embed and all(loaded_at_embed), loaded_at_embed
    assert loaded_at_denoise and not any(loaded_at_denoise)  # offloaded when denoising starts
    assert staged and staged.count("h2d") == staged.count("d2h"), staged

"""Every family reports its denoise steps: pipelines with `callback_on_step_end`, older ones with only
`callback(step, timestep, latents)` (PixArt-Sigma), and ones with neither, whose progress bar is followed
(LongCat-Image, DreamLite). Each request shows one step event per step, 1..n of n, and its output is still plain
diffusers' own, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from test_new_families import PROMPT, plain_output
from test_sweep_families import GENERATION, build_sweep_family

from omni_console.engine.engine import Engine
from omni_console.engine.events import StepTiming
from omni_console.engine.running.runner import GenerateRequest
from omni_console.engine.running.step_signal import attach_step_end
from omni_console.offload.module_hooks import Hooks
from omni_console.offload.policy import build_policy


class _Bar:
    """tqdm's two shapes, as diffusers' `progress_bar` returns them."""

    def __init__(self, iterable=None):
        self.iterable, self.updates = iterable, 0

    def __iter__(self):
        return iter(self.iterable)

    def update(self, n=1):
        self.updates += n


class _ProgressOnly:
    def __init__(self):
        self.seen: list = []

    def progress_bar(self, iterable=None, total=None):
        return _Bar(iterable)

    def __call__(self, prompt=None):
        for t in self.progress_bar([10, 20, 30]):
            self.seen.append(("body", t))
        bar = self.progress_bar(total=2)
        for _ in range(2):
            self.seen.append(("body", None))
            bar.update()


def test_a_pipeline_with_only_a_progress_bar_reports_each_step_after_its_body():
    pipe = _ProgressOnly()
    ends = []
    hooks = Hooks()
    kwargs = attach_step_end(pipe, lambda p, step, t, kw: ends.append((step, t)) or pipe.seen.append("end"), hooks)
    assert kwargs == {}
    pipe()
    assert ends == [(0, 10), (1, 20), (2, 30), (3, None), (4, None)]
    assert pipe.seen == [("body", 10), "end", ("body", 20), "end", ("body", 30), "end",
                         ("body", None), "end", ("body", None), "end"]
    hooks.remove()
    assert "progress_bar" not in vars(pipe)  # the class's own method again: the next request starts afresh


def test_older_callbacks_and_step_end_callbacks_are_passed_as_the_pipeline_names_them():
    class Legacy:
        def __call__(self, prompt=None, callback=None, callback_steps=1):
            callback(0, 999, "not a tensor")

    class Current:
        def __call__(self, prompt=None, callback_on_step_end=None, callback=None):
            pass

    ends = []
    kwargs = attach_step_end(Legacy(), lambda p, step, t, kw: ends.append((step, t, kw)), Hooks())
    assert set(kwargs) == {"callback", "callback_steps"} and kwargs["callback_steps"] == 1
    kwargs["callback"](0, 999, "not a tensor")
    assert ends == [(0, 999, {})]
    current = lambda *a: {}  # noqa: E731
    assert attach_step_end(Current(), current, Hooks()) == {"callback_on_step_end": current}


@pytest.mark.slow  # a load, a request and a plain pipeline call per family
@pytest.mark.parametrize("family", ["longcat_image", "dreamlite", "pixart_sigma"])
def test_every_step_is_reported_and_the_output_is_plain_diffusers(family, tmp_path, pixart_model_dir):
    if family == "pixart_sigma":
        path = pixart_model_dir
        request = GenerateRequest(prompt=PROMPT, steps=3, height=32, width=32, seed=7, max_sequence_length=16,
                                  guidance=3.0, output_type="np")
        expected = _plain(path, request)
    else:
        path = build_sweep_family(family, tmp_path / family)
        gen = dict(GENERATION[family])
        gen["num_inference_steps"] = 3
        from test_new_families import family_request

        engine_probe = Engine(path, device="cpu")
        request = family_request(family, engine_probe.model.pipeline_class, {family: gen})
        engine_probe.close()
        expected = plain_output(path, family, request, {})[0]
    engine = Engine(path, device="cpu")
    try:
        for policy in (build_policy({}, 0), build_policy({}, 0, mode="resident")):
            sub = engine.bus.subscribe()
            engine.load(policy)
            result = engine.generate(request)
            engine.unload()
            steps = [e for e in sub.drain() if isinstance(e, StepTiming)]
            assert [(s.step, s.total_steps) for s in steps] == [(1, 3), (2, 3), (3, 3)], (family, policy)
            assert all(s.wall_s > 0 for s in steps)
            got = np.stack(result.frames) if result.is_video else np.asarray(result.image)[None]
            assert np.array_equal(got.reshape(expected.shape), expected), (family, policy)
    finally:
        engine.close()


def _plain(path, request):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**request.call_kwargs(pipe))
    return np.asarray(out.images)

"""HunyuanVideo 1.5 guides through its `guider` component and has no guidance argument: `--guidance` is
refused before load with a line that says where its guidance comes from (it said the pipeline "takes no
guidance scale", as if it had none)."""

from __future__ import annotations

import pytest
from tiny_families_new import build_tiny_new_family

from omni_console.engine.errors import ConfigError
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.running.call_options import check_call
from omni_console.engine.running.runner import GenerateRequest


@pytest.mark.slow  # builds the family (diffusers' imports)
def test_guidance_refusal_names_the_guider_and_its_scale(tmp_path):
    model = discover_model(build_tiny_new_family("hunyuan_video15", tmp_path / "hv15"))
    request = GenerateRequest(prompt="a fox", steps=2, height=16, width=16, seed=0, frames=9, guidance=3.0)
    with pytest.raises(ConfigError) as refused:
        check_call(model, request, {"guidance": "--guidance"})
    assert str(refused.value) == ("--guidance: HunyuanVideo15Pipeline takes no guidance scale argument: its guidance "
                                  "comes from its guider component (guidance_scale 1.0 in this model), which this "
                                  "tool does not change; leave --guidance out")
    check_call(model, GenerateRequest(prompt="a fox", steps=2, height=16, width=16, seed=0, frames=9))

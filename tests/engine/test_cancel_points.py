"""Cancel points: a module list may hold `None` (a layer switched off in the config); the cancel hooks
skip it and still stop the request between two real blocks."""

from __future__ import annotations

import threading

import pytest
import torch

from omni_console.engine.running.runner import RequestCancelled, cancel_points, watch_cancel
from omni_console.offload.module_hooks import Hooks


def test_a_list_holding_none_gives_only_its_modules():
    first, last = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList([first, None, last])
    holder.off = torch.nn.ModuleList([None])

    points = cancel_points([holder])

    assert points == [first, last]


def _vae_without_mid_attention() -> torch.nn.Module:
    """The VAE diffusers' Kandinsky 5 test builds: its mid-block's attention list is `[None]`."""
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(block_out_channels=[32, 64], down_block_types=["DownEncoderBlock2D"] * 2,
                         up_block_types=["UpDecoderBlock2D"] * 2, latent_channels=16, layers_per_block=1,
                         mid_block_add_attention=False, norm_num_groups=32, use_quant_conv=False,
                         use_post_quant_conv=False).eval()


@pytest.mark.slow  # imports diffusers and builds a VAE
def test_a_vae_without_mid_attention_decodes_under_the_cancel_hooks_and_stops_when_cancelled():
    vae = _vae_without_mid_attention()
    assert list(vae.decoder.mid_block.attentions) == [None]
    latents = torch.randn(1, 16, 4, 4)
    with torch.no_grad():
        expected = vae.decode(latents).sample
    cancel, hooks = threading.Event(), Hooks()
    watch_cancel(hooks, [vae], cancel)
    try:
        with torch.no_grad():
            assert torch.equal(vae.decode(latents).sample, expected)
            cancel.set()
            with pytest.raises(RequestCancelled):
                vae.decode(latents)
    finally:
        hooks.remove()

"""More tiny random-weight pipelines from the installed diffusers' own families (issue 22's "further
families"): SD3.5 (qk-norm and dual-attention MMDiT), PixArt-Alpha, SkyReels-V2, Wan VACE, Latte, LTX
condition (0.9.5+), Bria, CogView4, Lumina-Next, Kandinsky 3, aMUSEd, HunyuanDiT, SanaVideo and Allegro (refused).

Same conventions as `tiny_families_loading` (deterministic per seed, safetensors only, written with
`save_pipeline`, a T5 or CLIP tokenizer built offline standing in where the real one needs a download);
configs as small as diffusers' own tests for these pipelines use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiny_families import make_pixart_sigma_pipeline, make_sd3_pipeline
from tiny_families_loading import T5_LAYOUT, _t5, _unipc, _wan_vae
from tiny_video_families import _ltx_components

from omni_console.engine.demo.demo_model import atomic_build, save_pipeline, seeded, tiny_vae

MORE_GENERATION: dict[str, dict[str, Any]] = {
    "sd35": {"height": 64, "width": 64, "num_inference_steps": 2, "max_sequence_length": 32},
    "pixart_alpha": {"height": 64, "width": 64, "num_inference_steps": 2, "max_sequence_length": 32,
                     "use_resolution_binning": False},
    "skyreels_v2": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2, "max_sequence_length": 16},
    "wan_vace": {"height": 32, "width": 32, "num_frames": 5, "num_inference_steps": 2, "max_sequence_length": 16},
    # Latte renders 1 frame or exactly its transformer's `video_length` (4 here): its temporal position table
    "latte": {"height": 32, "width": 32, "video_length": 4, "num_inference_steps": 2, "clean_caption": False},
    "ltx_condition": {"height": 32, "width": 32, "num_frames": 9, "num_inference_steps": 2, "max_sequence_length": 16},
    "bria": {"height": 64, "width": 64, "num_inference_steps": 2, "max_sequence_length": 16},
    "cogview4": {"height": 32, "width": 32, "num_inference_steps": 2},
    "lumina": {"height": 32, "width": 32, "num_inference_steps": 2, "clean_caption": False},
    "kandinsky3": {"height": 16, "width": 16, "num_inference_steps": 2},
    "amused": {"height": 16, "width": 16, "num_inference_steps": 2},
    "hunyuan_dit": {"height": 32, "width": 32, "num_inference_steps": 2, "use_resolution_binning": False},
    "allegro": {"height": 16, "width": 16, "num_frames": 8, "num_inference_steps": 1, "max_sequence_length": 16},
    "sana_video": {"height": 32, "width": 32, "frames": 5, "num_inference_steps": 2, "max_sequence_length": 16,
                   "use_resolution_binning": False},
}
"""Small call kwargs per family."""
LATTE_FRAMES = 4


def make_sd35_pipeline(seed: int):
    """SD3.5: the SD3 parts with an RMS-normed, dual-attention MMDiT (SD3.5 Medium's layout)."""
    from diffusers import SD3Transformer2DModel, StableDiffusion3Pipeline

    parts = make_sd3_pipeline(seed).components
    with seeded(seed, 4):
        parts["transformer"] = SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=3, attention_head_dim=16,
            num_attention_heads=4, joint_attention_dim=64, caption_projection_dim=64, pooled_projection_dim=64,
            pos_embed_max_size=16, qk_norm="rms_norm", dual_attention_layers=(0,)).eval()
    return StableDiffusion3Pipeline(**parts)


def make_pixart_alpha_pipeline(seed: int):
    """PixArt-Alpha: PixArt-Sigma's parts under PixArtAlphaPipeline."""
    from diffusers import PixArtAlphaPipeline

    return PixArtAlphaPipeline(**make_pixart_sigma_pipeline(seed).components)


def _wan_like(cls_name: str, seed: int, index: int, **extra):
    import diffusers

    with seeded(seed, index):
        return getattr(diffusers, cls_name)(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
            text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32, **extra).eval()


def make_skyreels_v2_pipeline(seed: int):
    """SkyReels-V2 text-to-video: Wan's parts, its own DiT class."""
    from diffusers import SkyReelsV2Pipeline

    tok, encoder = _t5(seed, 1, umt5=True)
    return SkyReelsV2Pipeline(tokenizer=tok, text_encoder=encoder, vae=_wan_vae(seed, 3), scheduler=_unipc(),
                              transformer=_wan_like("SkyReelsV2Transformer3DModel", seed, 2))


def make_wan_vace_pipeline(seed: int):
    """Wan VACE: Wan's parts, a DiT with `blocks` and `vace_blocks` (called from inside the main blocks)."""
    from diffusers import WanVACEPipeline

    tok, encoder = _t5(seed, 1, umt5=True)
    return WanVACEPipeline(tokenizer=tok, text_encoder=encoder, vae=_wan_vae(seed, 3), scheduler=_unipc(),
                           transformer=_wan_like("WanVACETransformer3DModel", seed, 2, vace_layers=[0, 1],
                                                 vace_in_channels=96))


def make_latte_pipeline(seed: int):
    """Latte: T5, a DiT with spatial `transformer_blocks` and `temporal_transformer_blocks` interleaved."""
    from diffusers import DDIMScheduler, LattePipeline, LatteTransformer3DModel

    tok, encoder = _t5(seed, 1)
    with seeded(seed, 2):
        transformer = LatteTransformer3DModel(
            sample_size=4, num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=3,
            caption_channels=32, in_channels=4, cross_attention_dim=24, out_channels=8, attention_bias=True,
            activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
            norm_elementwise_affine=False, norm_eps=1e-6, video_length=LATTE_FRAMES).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.18215, shift_factor=None)
    return LattePipeline(tokenizer=tok, text_encoder=encoder, vae=vae, transformer=transformer,
                         scheduler=DDIMScheduler())


def make_ltx_condition_pipeline(seed: int):
    """LTX-Video 0.9.5+ (LTXConditionPipeline): the LTX parts; its scheduler without dynamic shifting (this
    pipeline passes no `mu`, as the 0.9.5 checkpoints' scheduler configs have it)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LTXConditionPipeline

    parts = _ltx_components(seed)
    parts["scheduler"] = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=1.0,
                                                         use_dynamic_shifting=False)
    return LTXConditionPipeline(**parts)


def make_bria_pipeline(seed: int):
    """Bria: T5 only, a Flux-like DiT (`transformer_blocks`, `single_transformer_blocks`)."""
    from diffusers import BriaPipeline, BriaTransformer2DModel, FlowMatchEulerDiscreteScheduler

    tok, encoder = _t5(seed, 1)
    with seeded(seed, 2):
        transformer = BriaTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=None,
            axes_dims_rope=[0, 4, 4]).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.13025, shift_factor=None)
    return BriaPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                        text_encoder=encoder, tokenizer=tok)


def make_cogview4_pipeline(seed: int):
    """CogView4: a GLM text encoder (T5 tokenizer offline), DiT with `transformer_blocks`."""
    from diffusers import CogView4Pipeline, CogView4Transformer2DModel, FlowMatchEulerDiscreteScheduler
    from transformers import GlmConfig, GlmModel

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tok = build_t5_tokenizer()
    with seeded(seed, 1):
        text_encoder = GlmModel(GlmConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=32,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          head_dim=8, max_position_embeddings=512, pad_token_id=0)).eval()
    with seeded(seed, 2):
        transformer = CogView4Transformer2DModel(
            patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4, num_attention_heads=4,
            out_channels=4, text_embed_dim=32, time_embed_dim=8, condition_dim=4).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.18215, shift_factor=None)
    scheduler = FlowMatchEulerDiscreteScheduler(base_shift=0.25, max_shift=0.75, base_image_seq_len=256,
                                                use_dynamic_shifting=True, time_shift_type="linear")
    return CogView4Pipeline(tokenizer=tok, text_encoder=text_encoder, vae=vae, transformer=transformer,
                            scheduler=scheduler)


def make_lumina_pipeline(seed: int):
    """Lumina-Next (LuminaPipeline): a Gemma encoder (T5 tokenizer offline), Next-DiT with `layers`."""
    from diffusers import FlowMatchEulerDiscreteScheduler, LuminaNextDiT2DModel, LuminaPipeline
    from transformers import GemmaConfig, GemmaModel

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tok = build_t5_tokenizer()
    with seeded(seed, 1):
        text_encoder = GemmaModel(GemmaConfig(vocab_size=len(tok), hidden_size=8, intermediate_size=16,
                                              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                              head_dim=4, max_position_embeddings=512, pad_token_id=0)).eval()
    with seeded(seed, 2):
        transformer = LuminaNextDiT2DModel(
            sample_size=4, patch_size=2, in_channels=4, hidden_size=4, num_layers=2, num_attention_heads=1,
            num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5, learn_sigma=True,
            qk_norm=True, cross_attention_dim=8, scaling_factor=1.0).eval()
    with seeded(seed, 3):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.18215, shift_factor=None)
    return LuminaPipeline(transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                          text_encoder=text_encoder, tokenizer=tok)


def make_kandinsky3_pipeline(seed: int):
    """Kandinsky 3: T5, its own UNet class (`Kandinsky3UNet`), a MoVQ VQ-VAE (`movq`)."""
    from diffusers import DDPMScheduler, Kandinsky3Pipeline, Kandinsky3UNet, VQModel

    tok, encoder = _t5(seed, 1)
    with seeded(seed, 2):
        unet = Kandinsky3UNet(in_channels=4, time_embedding_dim=4, groups=2, attention_head_dim=4, layers_per_block=3,
                              block_out_channels=(32, 64), cross_attention_dim=4, encoder_hid_dim=32).eval()
    with seeded(seed, 3):
        movq = VQModel(block_out_channels=[32, 64], down_block_types=["DownEncoderBlock2D", "AttnDownEncoderBlock2D"],
                       in_channels=3, latent_channels=4, layers_per_block=1, norm_num_groups=8, norm_type="spatial",
                       num_vq_embeddings=12, out_channels=3, vq_embed_dim=4,
                       up_block_types=["AttnUpDecoderBlock2D", "UpDecoderBlock2D"]).eval()
    scheduler = DDPMScheduler(beta_start=0.00085, beta_end=0.012, steps_offset=1, beta_schedule="squaredcos_cap_v2",
                              clip_sample=True, thresholding=False)
    return Kandinsky3Pipeline(tokenizer=tok, text_encoder=encoder, unet=unet, scheduler=scheduler, movq=movq)


def make_amused_pipeline(seed: int):
    """aMUSEd: CLIP with projection, a masked-token U-ViT (`UVit2DModel`), a VQ-VAE (`vqvae`)."""
    from diffusers import AmusedPipeline, AmusedScheduler, UVit2DModel, VQModel
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    from omni_console.engine.demo.tokenizers_offline import build_clip_tokenizer

    tok = build_clip_tokenizer()
    with seeded(seed, 1):
        encoder = CLIPTextModelWithProjection(CLIPTextConfig(
            bos_token_id=0, eos_token_id=2, hidden_size=8, intermediate_size=8, layer_norm_eps=1e-05,
            num_attention_heads=1, num_hidden_layers=1, pad_token_id=1, vocab_size=len(tok), projection_dim=8)).eval()
    with seeded(seed, 2):
        transformer = UVit2DModel(
            hidden_size=8, use_bias=False, hidden_dropout=0.0, cond_embed_dim=8, micro_cond_encode_dim=2,
            micro_cond_embed_dim=10, encoder_hidden_size=8, vocab_size=32, codebook_size=8, in_channels=8,
            block_out_channels=8, num_res_blocks=1, downsample=True, upsample=True, block_num_heads=1,
            num_hidden_layers=2, num_attention_heads=1, attention_dropout=0.0, intermediate_size=8,
            layer_norm_eps=1e-06, ln_elementwise_affine=True).eval()
    with seeded(seed, 3):
        vqvae = VQModel(act_fn="silu", block_out_channels=[8], down_block_types=["DownEncoderBlock2D"], in_channels=3,
                        latent_channels=8, layers_per_block=1, norm_num_groups=8, num_vq_embeddings=8, out_channels=3,
                        sample_size=8, up_block_types=["UpDecoderBlock2D"], mid_block_add_attention=False,
                        lookup_from_codebook=True).eval()
    return AmusedPipeline(vqvae=vqvae, tokenizer=tok, text_encoder=encoder, transformer=transformer,
                          scheduler=AmusedScheduler(mask_token_id=31))


def _bert_tokenizer():
    """A BERT WordPiece tokenizer over single characters, built offline (HunyuanDiT's CLIP-like Chinese BERT
    stand-in)."""
    import string

    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import BertTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                          *string.ascii_lowercase, *string.digits, *string.punctuation])}
    core = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return BertTokenizerFast(tokenizer_object=core, model_max_length=77)


def make_hunyuan_dit_pipeline(seed: int):
    """HunyuanDiT: a BERT and a T5 text encoder, a DiT with skip connections between its `blocks`."""
    from diffusers import DDPMScheduler, HunyuanDiT2DModel, HunyuanDiTPipeline
    from transformers import BertConfig, BertModel

    tok = _bert_tokenizer()
    with seeded(seed, 1):
        encoder = BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=37, max_position_embeddings=512), add_pooling_layer=False)
    tok_2, encoder_2 = _t5(seed, 2)
    with seeded(seed, 3):
        transformer = HunyuanDiT2DModel(
            sample_size=16, num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=3, in_channels=4,
            cross_attention_dim=32, cross_attention_dim_t5=32, pooled_projection_dim=16, hidden_size=24,
            activation_fn="gelu-approximate").eval()
    with seeded(seed, 4):
        vae = tiny_vae(latent_channels=4, scaling_factor=0.13025, shift_factor=None)
    return HunyuanDiTPipeline(vae=vae, text_encoder=encoder.eval(), tokenizer=tok, transformer=transformer,
                              scheduler=DDPMScheduler(), safety_checker=None, feature_extractor=None,
                              text_encoder_2=encoder_2, tokenizer_2=tok_2, requires_safety_checker=False)


def make_allegro_pipeline(seed: int):
    """Allegro: T5, a video DiT, the Allegro VAE (which decodes only with tiling enabled)."""
    from diffusers import AllegroPipeline, AllegroTransformer3DModel, AutoencoderKLAllegro, DDIMScheduler

    tok, encoder = _t5(seed, 1, d_model=24)
    with seeded(seed, 2):
        transformer = AllegroTransformer3DModel(
            num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, num_layers=2,
            cross_attention_dim=24, sample_width=8, sample_height=8, sample_frames=8, caption_channels=24).eval()
    with seeded(seed, 3):
        vae = AutoencoderKLAllegro(
            in_channels=3, out_channels=3, down_block_types=("AllegroDownBlock3D",) * 4,
            up_block_types=("AllegroUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
            layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4).eval()
    return AllegroPipeline(tokenizer=tok, text_encoder=encoder, vae=vae, transformer=transformer,
                           scheduler=DDIMScheduler())


def make_sana_video_pipeline(seed: int):
    """SanaVideo: a Gemma2 text encoder (T5 tokenizer offline), a linear-attention video DiT, the Wan VAE; its
    call names the frame count `frames`."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SanaVideoPipeline, SanaVideoTransformer3DModel
    from transformers import Gemma2Config, Gemma2Model

    from omni_console.engine.demo.tokenizers_offline import build_t5_tokenizer

    tok = build_t5_tokenizer()
    with seeded(seed, 1):
        encoder = Gemma2Model(Gemma2Config(
            head_dim=16, hidden_size=8, intermediate_size=64, max_position_embeddings=512, num_attention_heads=2,
            num_hidden_layers=1, num_key_value_heads=2, vocab_size=len(tok), pad_token_id=0)).eval()
    with seeded(seed, 2):
        transformer = SanaVideoTransformer3DModel(
            in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=12, num_layers=2,
            num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24, caption_channels=8,
            sample_size=8, patch_size=(1, 2, 2), rope_max_seq_len=32).eval()
    return SanaVideoPipeline(tokenizer=tok, text_encoder=encoder, vae=_wan_vae(seed, 3), transformer=transformer,
                             scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))


SD3_LAYOUT = {"tokenizer_3": "T5TokenizerFast"}
MAKERS: dict[str, tuple[Callable[[int], Any], dict[str, str]]] = {
    "sd35": (make_sd35_pipeline, SD3_LAYOUT),
    "pixart_alpha": (make_pixart_alpha_pipeline, {}),
    "skyreels_v2": (make_skyreels_v2_pipeline, T5_LAYOUT),
    "wan_vace": (make_wan_vace_pipeline, T5_LAYOUT),
    "latte": (make_latte_pipeline, T5_LAYOUT),
    "ltx_condition": (make_ltx_condition_pipeline, T5_LAYOUT),
    "bria": (make_bria_pipeline, T5_LAYOUT),
    "cogview4": (make_cogview4_pipeline, T5_LAYOUT),
    "lumina": (make_lumina_pipeline, T5_LAYOUT),
    "kandinsky3": (make_kandinsky3_pipeline, T5_LAYOUT),
    "amused": (make_amused_pipeline, {}),
    "hunyuan_dit": (make_hunyuan_dit_pipeline, {"tokenizer_2": "T5TokenizerFast"}),
    "allegro": (make_allegro_pipeline, T5_LAYOUT),
    "sana_video": (make_sana_video_pipeline, {}),
}


def build_tiny_more_family(family: str, path: Path, seed: int = 0) -> Path:
    """Write family `family` of `MAKERS` to `path` (atomically; an identical earlier build is kept)."""
    make, layout = MAKERS[family]

    def build(tmp: Path) -> None:
        save_pipeline(make(seed), tmp, class_names=layout)

    return atomic_build(Path(path), build, {"family": family, "seed": seed})

"""Config numbers that would make `__init__` allocate without bound are one line (exit 2) before load.

Each case copies a tiny pipeline into `tmp_path`, writes one hostile number, and runs `plan` as the operator
would: exactly one `omni-console: error:` line naming the file and the field, no traceback. Real values of
the same kinds (token ids, transformers' "no limit" `model_max_length`, DPM-Solver's `-inf`) still plan.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_hostile_dirs import assert_refused, copy_model, edit_json

from omni_console.console.cli import main
from omni_console.engine.model_dir.discovery import discover_model
from omni_console.engine.model_dir.size_bounds import MAX_ADDED_TOKENS


def _set(rel: str, key: str, value: object) -> Callable[[Path], None]:
    return lambda root: edit_json(root / rel, lambda doc: doc.__setitem__(key, value))


def _added_tokens(count: int) -> Callable[[Path], None]:
    def add(root: Path) -> None:
        def grow(doc: dict) -> None:
            doc["added_tokens"] += [{"id": 50_000 + i, "content": f"<x{i}>", "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": True} for i in range(count)]
        edit_json(root / "tokenizer_2" / "tokenizer.json", grow)
    return add


# The cases on the Flux demo pipeline: (mutation, fragments of the one line)
DEMO_CASES: dict[str, tuple[Callable[[Path], None], tuple[str, ...]]] = {
    "vae layers_per_block 1e9": (_set("vae/config.json", "layers_per_block", 10**9),
                                 ("vae/config.json", "'layers_per_block' = 1000000000", "weights hold")),
    "t5 relative_attention_num_buckets 1e9": (
        _set("text_encoder_2/config.json", "relative_attention_num_buckets", 10**9),
        ("text_encoder_2/config.json", "'relative_attention_num_buckets'", "refused before load")),
    "flux num_layers 1e8": (_set("transformer/config.json", "num_layers", 10**8),
                            ("transformer/config.json", "num_layers = 100000000 but the weights hold 2",
                             "config and tensors disagree")),
    "flux axes_dims_rope 1e6": (_set("transformer/config.json", "axes_dims_rope", [10**6, 6, 6]),
                                ("transformer/config.json", "'axes_dims_rope' = 1000000")),
    "clip max_position_embeddings 1e9": (_set("text_encoder/config.json", "max_position_embeddings", 10**9),
                                         ("'max_position_embeddings'",)),
    "an unknown field 1e12": (_set("transformer/config.json", "hostile_width", 10**12), ("'hostile_width'",)),
    "a nested field 1e9": (_set("text_encoder/config.json", "rope_scaling", {"factor": 2, "max_len": 10**9}),
                           ("'max_len'",)),
    "a 4000-digit int": (_set("vae/config.json", "layers_per_block", int("9" * 4000)), ("'layers_per_block' = 999",)),
    "scheduler num_train_timesteps 5e8": (_set("scheduler/scheduler_config.json", "num_train_timesteps", 5 * 10**8),
                                          ("scheduler_config.json", "'num_train_timesteps' = 500000000",
                                           "without weights")),
    "tokenizer model_max_length 1e9": (_set("tokenizer/tokenizer_config.json", "model_max_length", 10**9),
                                       ("tokenizer_config.json", "'model_max_length' = 1000000000")),
    "200,000 added tokens": (_added_tokens(200_000), ("tokenizer.json", "added tokens", f"{MAX_ADDED_TOKENS:,}")),
    "added_tokens_decoder of 70,000": (
        _set("tokenizer/tokenizer_config.json", "added_tokens_decoder",
             {str(50_000 + i): {"content": f"<y{i}>", "special": True} for i in range(70_000)}),
        ("tokenizer_config.json", "70,000 added tokens")),
    "vae 100,000 block_out_channels": (_set("vae/config.json", "block_out_channels", [16] * 100_000),
                                       ("'block_out_channels' lists 100,000 values", "tensors its weights hold")),
    "NaN scaling_factor": (lambda root: (root / "vae" / "config.json").write_text(
        (root / "vae" / "config.json").read_text().replace('"scaling_factor": 0.3611', '"scaling_factor": NaN')),
        ("'scaling_factor' is NaN",)),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if "added" in c else c  # 1.5-2.5 s each
                                  for c in sorted(DEMO_CASES)])
def test_size_like_values_no_weight_backs_are_refused_before_load(case, demo_model_dir, tmp_path, capsys):
    mutate, fragments = DEMO_CASES[case]
    root = copy_model(demo_model_dir, tmp_path)
    mutate(root)
    message = assert_refused(root, capsys, *fragments)
    assert len(message) < 400, message  # the number is cut short, not echoed whole


def test_values_of_the_same_kinds_that_real_models_hold_still_plan(demo_model_dir, tmp_path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    _set("tokenizer/tokenizer_config.json", "model_max_length", int(1e30))(root)  # transformers' "no limit"
    _set("text_encoder/config.json", "image_token_id", 151_655)(root)  # ids name a value, not a size
    _set("text_encoder/config.json", "eos_token_id", [151_329, 151_336])(root)
    _set("text_encoder/config.json", "rope_theta", 10**9)(root)
    _set("scheduler/scheduler_config.json", "lambda_min_clipped", float("-inf"))(root)
    _added_tokens(2_000)(root)
    assert main(["plan", "--model", str(root)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("rel,key,value", [("transformer/config.json", "rope_max_seq_len", 10**9),
                                           ("vae/config.json", "num_res_blocks", 10**9),
                                           ("text_encoder/config.json", "relative_attention_num_buckets", 10**9)])
def test_wan_tables_and_counts_are_bounded(rel, key, value, wan_model_dir, tmp_path, capsys):
    root = copy_model(wan_model_dir, tmp_path)
    _set(rel, key, value)(root)
    assert_refused(root, capsys, rel, f"{key!r} = {value}", "refused before load")


def test_unet_counts_are_bounded(tmp_path, capsys):
    from tiny_families_unet import build_tiny_sd15

    root = build_tiny_sd15(tmp_path / "sd15")
    _set("unet/config.json", "layers_per_block", 10**9)(root)
    assert_refused(root, capsys, "unet/config.json", "'layers_per_block' = 1000000000")


def test_a_quant_method_of_100_kb_is_quoted_short(demo_model_dir, tmp_path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    _set("transformer/config.json", "quantization_config", {"quant_method": "x" * 100_000})(root)
    message = assert_refused(root, capsys, "not a quantization method diffusers loads", "xxx…")
    assert len(message) < 400, len(message)


# ----------------------------------------------------------------- model_index.json: before load, not after

def test_a_boundary_ratio_of_4000_digits_is_refused(demo_model_dir, tmp_path, capsys):
    root = copy_model(demo_model_dir, tmp_path)
    (root / "model_index.json").write_text(
        (root / "model_index.json").read_text().replace("{", '{"boundary_ratio": ' + "9" * 4000 + ",", 1))
    assert_refused(root, capsys, "'boundary_ratio' is an integer of 4000 digits")


def test_a_left_out_transformer_beside_a_transformer_2_is_refused(wan_model_dir, tmp_path, capsys):
    root = copy_model(wan_model_dir, tmp_path)
    (root / "transformer").rename(root / "transformer_2")
    edit_json(root / "model_index.json", lambda doc: doc.update(
        transformer=[None, None], transformer_2=["diffusers", "WanTransformer3DModel"]))
    assert_refused(root, capsys, "'transformer' is left out ([null, null]) but 'transformer_2' is given",
                   "refused before load")
    edit_json(root / "model_index.json", lambda doc: doc.update(transformer_2=[None, None]))
    assert discover_model(root).pipeline_class == "WanPipeline"  # both left out: no second expert to mislead


def test_a_left_out_text_encoder_beside_a_text_encoder_2_is_not_that_refusal(demo_model_dir, tmp_path, capsys):
    """SDXL's refiner saves `text_encoder: [null, null]` beside `text_encoder_2`: only a denoiser's first is needed."""
    root = copy_model(demo_model_dir, tmp_path)
    edit_json(root / "model_index.json", lambda doc: doc.update(text_encoder=[None, None]))
    assert discover_model(root).pipeline_class == "FluxPipeline"


# ----------------------------------------------------------------- run: refused before torch allocates

@pytest.mark.slow
def test_run_refuses_before_load_under_a_memory_cap(demo_model_dir, tmp_path):
    """A regression here would grow the process without bound: the child runs under a 4 GiB address cap."""
    root = copy_model(demo_model_dir, tmp_path)
    _set("vae/config.json", "layers_per_block", 10**9)(root)
    out = tmp_path / "out.png"

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

    done = subprocess.run([sys.executable, "-m", "omni_console.console.cli", "run", "--model", str(root),
                           "--headless", "--steps", "1", "--height", "32", "--width", "32", "--output", str(out)],
                          capture_output=True, text=True, timeout=300, preexec_fn=cap)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "'layers_per_block' = 1000000000" in done.stderr, done.stderr
    assert not out.exists()
    json.loads((root / "vae" / "config.json").read_text())  # the directory is untouched


@pytest.mark.slow
def test_a_config_declaring_a_tensor_the_weights_lack_names_it(demo_model_dir, tmp_path, capsys):
    """`use_quant_conv: true` without quant_conv's weights: one true line naming the tensor, exit 1, no file
    (it was a raw 'cannot stage a meta tensor')."""
    root = copy_model(demo_model_dir, tmp_path)
    _set("vae/config.json", "use_quant_conv", True)(root)
    out = tmp_path / "out.png"
    code = main(["run", "--model", str(root), "--headless", "--steps", "1", "--height", "32", "--width", "32",
                 "--output", str(out)])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert code == 1 and "Traceback" not in err, err
    assert "vae: quant_conv.weight was never loaded" in last and "config and weights disagree" in last, last
    assert not out.exists()


def test_a_tokenizer_model_that_is_no_tokenizer_says_so(demo_model_dir, tmp_path):
    """No tokenizer.json and a tokenizer.model that is garbage: transformers' last try says only that tiktoken is
    needed; the line says what the folder holds and what could not read it."""
    from omni_console.engine.errors import ModelDirError
    from omni_console.engine.loading.loader import load_component

    root = copy_model(demo_model_dir, tmp_path)
    (root / "tokenizer_2" / "tokenizer.json").unlink()
    (root / "tokenizer_2" / "tokenizer.model").write_bytes(b"not a tokenizer\n")
    info = discover_model(root).component("tokenizer_2")
    with pytest.raises(ModelDirError) as caught:
        load_component(info)
    line = str(caught.value)
    assert "\n" not in line and "T5TokenizerFast.from_pretrained failed" in line, line
    assert "no tokenizer.json, and tokenizer.model could be read neither as a SentencePiece model nor as a tiktoken " \
           "file" in line, line
    assert "Install it with" not in line


@pytest.mark.slow
def test_a_layer_count_above_the_weights_fails_instead_of_running_random_layers(demo_model_dir, tmp_path, capsys):
    """CLIP's `num_hidden_layers` one above the layers its weights hold: transformers would fill the extra layer
    with random values and `run` exited 0 with a wrong image; now one line names the missing layer, exit 1."""
    root = copy_model(demo_model_dir, tmp_path)
    config = root / "text_encoder" / "config.json"
    edit_json(config, lambda doc: doc.update(num_hidden_layers=doc["num_hidden_layers"] + 1))
    layers = json.loads((root / "text_encoder" / "config.json").read_text())["num_hidden_layers"]
    out = tmp_path / "out.png"
    code = main(["run", "--model", str(root), "--headless", "--steps", "1", "--height", "32", "--width", "32",
                 "--output", str(out)])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 1 and not out.exists(), last
    expected = ("text_encoder: its config declares 1 list entries its weights do not hold "
                f"(e.g. encoder.layers.{layers - 1})")
    assert expected in last, last


def test_a_size_the_weights_back_but_the_host_cannot_hold_is_refused(demo_model_dir, tmp_path, capsys, monkeypatch):
    """A real-size model backs large numbers with its weights; the host's memory still bounds a table's length
    (here a host of 64 MiB: 65,536 rows of 1 KiB, below the transformer's 613,824 values)."""
    from omni_console.engine.model_dir import size_bounds

    monkeypatch.setattr(size_bounds, "host_bytes", lambda: 64 * 2**20)
    root = copy_model(demo_model_dir, tmp_path)
    _set("transformer/config.json", "rope_max_seq_len", 300_000)(root)
    assert_refused(root, capsys, "'rope_max_seq_len' = 300000, but this host's 67.1 MB",
                   "could not hold a table that long")

#!/usr/bin/env bash
# One GPU-machine call: install the project from carried wheels, run every `cuda` test, then the
# DLO benchmark. Results land in $OUT (cuda.log, bench.log, dlo_stream.json, ...).
# Usage on the device: bash benchmarks/gpu_run.sh [tests|bench|fp8|fp8-all|fp8-upcast|unet|e2e|video|experts|sweep|forecast|replan|load-wan|ranks|allgather|console|console-flux|console-watched|console-previews|console-eyes|cuda-tests|cards|host-tiers-flux|host-tiers-wan|host-tiers-a14b|host-rss-flux16|before-after|console-plots|cache|cache-exact|hiccups|compile|compile-phases|compile-wan|lora|all] [benchmark args...]
# `tests` also runs benchmarks/cpu_exactness.py on the host CPU (the tiny families written by
# tests/write_tiny_families.py). Benchmarks run from the repository root as modules: python3 -m benchmarks.NAME.
set -uo pipefail
what=${1:-all}; shift || true
OUT=${OUT:-out}; mkdir -p "$OUT"
if [[ ! -f /tmp/site/.installed-$PPID ]]; then  # once per calling shell: a second entry in the same call reuses it
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . \
    && touch /tmp/site/.installed-$PPID || exit 1
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,pcie.link.gen.current,pcie.link.width.current \
  --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, diffusers, transformers; print(torch.__version__, diffusers.__version__, transformers.__version__)" \
  >> "$OUT/gpu.txt" 2>&1
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -m cuda -q -rA -p no:cacheprovider tests 2>&1 | tail -60 > "$OUT/cuda.log"
  # the host CPU too: staged components must stay bit-identical on its kernels (AVX-512 or not)
  lscpu | grep -E "Model name|Flags" | cut -c1-400 >> "$OUT/gpu.txt"
  { python3 tests/write_tiny_families.py /tmp/tiny-families \
      && timeout 300 python3 -m benchmarks.cpu_exactness --tiny-dir /tmp/tiny-families --out "$OUT/cpu_exactness.json"; \
  } > "$OUT/cpu_exactness.log" 2>&1
fi
if [[ $what == bench || $what == all ]]; then
  python3 -m benchmarks.dlo_stream --out "$OUT/dlo_stream.json" "$@" 2>&1 | tail -40 > "$OUT/bench.log"
fi
if [[ $what == fp8 ]]; then  # fp8 storage vs bf16, every block streamed, Flux-dev-size at 1024²
  python3 -m benchmarks.fp8_stream --out "$OUT/fp8_stream.json" "$@" 2>&1 | grep -v "kept in float32" \
    | tail -40 > "$OUT/fp8.log"
fi
if [[ $what == fp8-all ]]; then  # issue 26's GPU measurements in about 4 minutes (each part time-boxed)
  # Flux-dev-size 1024²: every run, the upcast rate, per-block CUDA events of each DLO run (--profile)
  timeout 200 python3 -m benchmarks.fp8_stream --profile --out "$OUT/fp8_stream.json" 2>&1 \
    | grep -v "kept in float32" | tail -40 > "$OUT/fp8.log"
  # Wan2.1-14B-size 81x480x832: fp8 streamed vs resident fp8 (layerwise casting); target <= 1.03x
  timeout 100 python3 -m benchmarks.fp8_stream --preset wan14b --runs layerwise dlo_fp8 --iters 2 \
    --out "$OUT/fp8_wan.json" 2>&1 | grep -v "kept in float32" | tail -20 > "$OUT/fp8_wan.log"
  # the VRAM-budget planner with fp8 storage on the Flux-size model, 8-24 GB
  timeout 110 python3 -m benchmarks.budget_sweep --model flux --stream-dtype float8_e4m3fn --points 0 20 40 57 \
    --depths 2 4 --budgets 8 12 16 24 --out "$OUT/fp8_sweep.json" 2>&1 | grep -v "kept in float32" \
    | tail -40 > "$OUT/fp8_sweep.log"
fi
if [[ $what == fp8-upcast ]]; then  # issue 26: resident fp8 blocks kept upcast, weighed by the planner (< 3 min)
  timeout 175 python3 -m benchmarks.budget_sweep --model flux --stream-dtype float8_e4m3fn --upcast \
    --points 0 20 40 57 --depths 2 4 --budgets 8 12 16 24 --out "$OUT/fp8_upcast_sweep.json" 2>&1 \
    | grep -v "kept in float32" | tail -60 > "$OUT/fp8_upcast_sweep.log"
fi
if [[ $what == lora ]]; then  # issue 38: rank-64 LoRA on every linear of a Flux-dev-size DiT, 1024², all streamed
  timeout ${LORA_TIMEOUT:-280} python3 -m benchmarks.lora_stream --out "$OUT/lora_stream.json" "$@" 2>&1 \
    | grep --line-buffered -v "kept in float32" > "$OUT/lora.log"
fi
if [[ $what == unet ]]; then  # SDXL-size UNet, 1024x1024, units (and whole blocks) streamed vs resident
  python3 -m benchmarks.unet_stream --out "$OUT/unet_stream.json" "$@" 2>&1 | tail -30 > "$OUT/unet.log"
fi
if [[ $what == e2e ]]; then
  python3 -m benchmarks.engine_e2e --out "$OUT/engine_e2e.json" "$@" 2>&1 | grep -v "kept in float32" \
    | tail -40 > "$OUT/e2e.log"
fi
if [[ $what == console-flux ]]; then  # the console on the Flux-size checkpoint (written if missing)
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  python3 -m benchmarks.console_responsiveness --device cuda --model /tmp/flux-size --height 1024 --width 1024 \
    --out "$OUT/console.json" "$@" 2>&1 | tail -60 > "$OUT/console.log"
fi
if [[ $what == console-watched ]]; then  # issue 27: watched at 160x48 and 80x24, esc and q during a request
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  python3 -m benchmarks.console_watched --device cuda --model /tmp/flux-size --height 1024 --width 1024 \
    --steps 20 --repeats 3 --key-steps 60 --presses 40 --sizes 160x48,80x24 --esc 5 --esc-delay-s 1.3 \
    --out "$OUT/console_watched.json" "$@" 2>&1 | tail -30 > "$OUT/console_watched.log"
  python3 -m benchmarks.startup --model /tmp/flux-size --runs 3 --busy-runs 3 --busy-steps 1000 --idle-s 3 \
    --out "$OUT/startup.json" 2>&1 | tail -10 > "$OUT/startup.log"
fi
if [[ $what == console-previews ]]; then  # issue 39: watched with step previews on, 160x48 and 80x24
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  python3 -m benchmarks.console_watched --device cuda --model /tmp/flux-size --height 1024 --width 1024 \
    --steps 20 --repeats 3 --key-steps 60 --presses 40 --sizes 160x48,80x24 --previews \
    --out "$OUT/console_previews.json" "$@" 2>&1 | tail -30 > "$OUT/console_previews.log"
fi
if [[ $what == console-eyes ]]; then  # issue 39 in one run: step previews on AND the plot screen open, both sizes
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  timeout ${EYES_TIMEOUT:-330} python3 -m benchmarks.console_watched --device cuda --model /tmp/flux-size --height 1024 \
    --width 1024 --steps 20 --repeats 3 --key-steps 60 --presses 30 --sizes 160x48,80x24 --previews --plots \
    --out "$OUT/console_eyes.json" "$@" 2>&1 | tail -30 > "$OUT/console_eyes.log"
  timeout 90 python3 -m omni_console.console.cli run --model /tmp/flux-size --height 1024 --width 1024 --steps 4 \
    --output /tmp/traced.png --overwrite --trace "$OUT/flux_trace.json" > "$OUT/trace_run.log" 2>&1
  python3 -c "import sys, json; sys.path.insert(0, 'tests/engine'); from trace_format import TraceFile, check_nesting; \
t = TraceFile.model_validate_json(open('$OUT/flux_trace.json').read()); check_nesting(t); \
from collections import Counter; print('trace valid:', Counter((e.ph, e.tid, e.cat) for e in t.traceEvents))" \
    >> "$OUT/trace_run.log" 2>&1
fi
if [[ $what == cuda-tests ]]; then  # the cuda tests alone, time-boxed
  # the whole output kept (cuda_full.log): a failure's traceback sits above the pass lines a tail keeps
  timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -m cuda -q -rA --tb=short -p no:cacheprovider tests \
    > "$OUT/cuda_full.log" 2>&1
  tail -80 "$OUT/cuda_full.log" > "$OUT/cuda.log"
  sed -n '/= FAILURES =/,/short test summary/p' "$OUT/cuda_full.log" | head -300 > "$OUT/cuda_failures.log"
fi
if [[ $what == console-plots ]]; then  # issue 39: watched with the plot screen (v) open, 160x48 and 80x24
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  python3 -m benchmarks.console_watched --device cuda --model /tmp/flux-size --height 1024 --width 1024 \
    --steps 20 --repeats 3 --key-steps 60 --presses 20 --sizes 160x48,80x24 --plots \
    --out "$OUT/console_plots.json" "$@" 2>&1 | tail -30 > "$OUT/console_plots.log"
  # a traced run: its trace validates against the trace-event format (tests/engine/trace_format.py)
  python3 -m omni_console.console.cli run --model /tmp/flux-size --height 1024 --width 1024 --steps 4 \
    --output /tmp/traced.png --overwrite --trace "$OUT/flux_trace.json" > "$OUT/trace_run.log" 2>&1
  python3 -c "import sys, json; sys.path.insert(0, 'tests/engine'); from trace_format import TraceFile, check_nesting; \
t = TraceFile.model_validate_json(open('$OUT/flux_trace.json').read()); check_nesting(t); \
from collections import Counter; print('trace valid:', Counter((e.ph, e.tid, e.cat) for e in t.traceEvents))" \
    >> "$OUT/trace_run.log" 2>&1
fi
if [[ $what == video ]]; then  # Wan2.1-14B-size, 81x480x832, through `run` to .mp4: DLO vs resident
  python3 -m benchmarks.video_e2e --dir /tmp/wan-size --out "$OUT/video_e2e.json" "$@" 2>&1 \
    | grep -v "kept in float32" | tail -40 > "$OUT/video.log"
fi
if [[ $what == experts ]]; then  # Wan 2.2 A14B-size: two experts share one budget (--frames/--layers: smaller)
  python3 -m benchmarks.experts_switch --out "$OUT/experts_switch.json" "$@" 2>&1 | tail -40 > "$OUT/experts.log"
fi
if [[ $what == sweep ]]; then  # VRAM-budget sweeps and the auto-plan: pass --model flux|wan
  python3 -m benchmarks.budget_sweep --out "$OUT/budget_sweep.json" "$@" 2>&1 | grep -v "kept in float32" \
    | tail -80 > "$OUT/sweep.log"
fi
if [[ $what == forecast ]]; then  # whole-request forecast and --vram-budget through `run` (Flux-size checkpoint)
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  python3 -m benchmarks.forecast_e2e --dir /tmp/flux-size --out "$OUT/forecast_e2e.json" "$@" 2>&1 \
    | grep -v "kept in float32" | tail -40 > "$OUT/forecast.log"
fi
if [[ $what == compile ]]; then  # issue 40: regional compile on streamed blocks, Flux-dev-size 1024² at 24 and 8 GB,
  # recompiles across the re-plan between them, exactness vs diffusers' compile_repeated_blocks, fp8 streamed
  timeout 560 python3 -m benchmarks.compile_stream --model flux --budgets 24 8 --stream-dtype float8_e4m3fn \
    --out "$OUT/compile_stream.json" "$@" 2>&1 | grep --line-buffered -v "kept in float32" > "$OUT/compile.log"
fi
if [[ $what == compile-phases ]]; then  # issue 40: the compile phase, cold then warm, in two fresh processes, for
  # the engine's regional compile (compile_phase.ours) and diffusers' compile_repeated_blocks, each with its timers
  timeout 560 python3 -m benchmarks.compile_stream --model flux --budgets --phases \
    --out "$OUT/compile_phases.json" "$@" 2>&1 | grep --line-buffered -v "kept in float32" > "$OUT/compile_phases.log"
fi
if [[ $what == compile-wan ]]; then  # issue 40: Wan2.1-14B-size 81x480x832 at 8 and 16 GB (a call of its own)
  timeout 560 python3 -m benchmarks.compile_stream --model wan --budgets 8 16 --iters 2 \
    --out "$OUT/compile_wan.json" "$@" 2>&1 | grep --line-buffered -v "kept in float32" > "$OUT/compile_wan.log"
fi
if [[ $what == replan ]]; then  # load floors, time to ready (warm, cold, diffusers beside it), live re-plan: Flux-size
  python3 -m benchmarks.replan_load --dir /tmp/flux-size --write flux --threads 16 --replan 28 --peers \
    --out "$OUT/replan_load.json" "$@" 2>&1 | grep --line-buffered -v "kept in float32" > "$OUT/replan.log"
fi
if [[ $what == load-wan ]]; then  # the same for the Wan2.1-14B-size checkpoint (the disk holds one of the two)
  rm -rf /tmp/flux-size
  python3 -m benchmarks.replan_load --dir /tmp/wan-size --write wan --threads 16 --peers \
    --out "$OUT/load_wan.json" "$@" 2>&1 | grep --line-buffered -v "kept in float32" > "$OUT/load_wan.log"
fi
if [[ $what == ranks ]]; then  # two GPUs (kind nvidia-h200-x2): one GPU vs AllGather vs rank-local, Flux-size
  export NCCL_NVLS_ENABLE=0
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  python3 -m benchmarks.ranks_e2e --dir /tmp/flux-size --out "$OUT/ranks_e2e.json" "$@" 2>&1 \
    | grep -v "kept in float32" | tail -40 > "$OUT/ranks.log"
fi
if [[ $what == allgather ]]; then  # two GPUs: AllGather stream by stream, its knobs side by side (synthetic Flux-size)
  export NCCL_NVLS_ENABLE=0
  nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
  python3 -m benchmarks.allgather_stream --out "$OUT/allgather_stream.json" "$@" 2>&1 | grep -v "kept in float32" \
    | tail -80 > "$OUT/allgather.log"
fi
if [[ $what == cards ]]; then  # 8/12/16/24 GB cards by ballast, fresh cache each: pass --kind flux|wan --dir DIR
  python3 -m benchmarks.real_cards --out "$OUT/real_cards.json" "$@" 2>&1 | grep --line-buffered -v "kept in float32" \
    > "$OUT/cards.log"
fi
if [[ $what == host-tiers-flux ]]; then  # issue 35: Flux-size on a 16 GB host + 12 GB card, then no-waste (~5 min)
  # the checkpoint is written first if missing (~1 min); everything is time-boxed to --deadline-s (540 s)
  rm -rf /tmp/wan-size /tmp/a14b-fp8  # the disk holds one of the checkpoints
  python3 -m benchmarks.host_tiers --presets flux16 nowaste --dir /tmp/flux-size --out "$OUT/host_tiers_flux.json" \
    "$@" 2>&1 | grep --line-buffered -v "kept in float32" > "$OUT/host_tiers_flux.log"
fi
if [[ $what == host-rss-flux16 ]]; then  # issue 35: flux16's plan (its budgets given, so no host limit is needed), RSS
  # per phase split into anonymous, file-backed and the engine's arenas: where the 6 % over the host forecast is
  rm -rf /tmp/wan-size /tmp/a14b-fp8  # the disk holds one of the checkpoints
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  timeout ${RSS_TIMEOUT:-300} python3 -m benchmarks.process_rss run --phases --out "$OUT/process_rss_flux16.json" -- \
    --model /tmp/flux-size --device cuda:0 --ram-budget 14.36GB --vram-budget 11.73GB --height 1024 --width 1024 \
    --guidance 3.5 --steps 4 --seed 3 "$@" 2>&1 | grep --line-buffered -v "kept in float32" | tail -60 > "$OUT/process_rss_flux16.log"
fi
if [[ $what == host-tiers-wan ]]; then  # issue 35: Wan2.1-14B-size + UMT5-XXL on a 32 GB host + 12 GB card (~7 min)
  rm -rf /tmp/flux-size /tmp/a14b-fp8  # the disk holds one of the checkpoints
  python3 -m benchmarks.host_tiers --presets wan32 --dir /tmp/wan-size --out "$OUT/host_tiers_wan.json" \
    "$@" 2>&1 | grep --line-buffered -v "kept in float32" > "$OUT/host_tiers_wan.log"
fi
if [[ $what == host-tiers-a14b ]]; then  # issue 35: Wan 2.2 A14B-size, fp8-stored experts (40.9 GB), 32 GB host +
  # 16 GB card, 9 steps across the boundary (~6 min; the write ~1.5 min of it, inside --deadline-s)
  rm -rf /tmp/flux-size /tmp/wan-size  # the disk holds one of the checkpoints
  python3 -m benchmarks.host_tiers --presets a14b --dir /tmp/a14b-fp8 --deadline-s 480 --out "$OUT/host_tiers_a14b.json" \
    "$@" 2>&1 | grep --line-buffered -v "kept in float32" > "$OUT/host_tiers_a14b.log"
fi
if [[ $what == before-after ]]; then  # issue 36: `run` before the request service (.before/, carried) vs this tree
  # .before/ is `git archive 17caf3e` (main before the service merged) without tests/docs; both share /tmp/site's libs
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site_before ./.before || exit 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site_after . || exit 1
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  python3 -m benchmarks.before_after --site-a /tmp/site_before --site-b /tmp/site_after --out "$OUT/before_after.json" \
    "$@" -- --model /tmp/flux-size --device cuda:0 --height 1024 --width 1024 --steps 2 --resident-layers 0 \
    --prompt "a red fox in the snow" --seed 3 2>&1 | grep -v "kept in float32" | tail -40 > "$OUT/before_after.log"
fi
if [[ $what == cache ]]; then  # issue 37: step caches on a streamed DiT, each run time-boxed (~10 min in all)
  i=0
  for args in "--preset flux --dtype bf16" "--preset flux --dtype fp8" "--preset wan" \
      "--preset flux --cache taylorseer:use_lite_mode=true,disable_cache_before_step=1,cache_interval=2"; do
    i=$((i + 1))
    timeout 170 python3 -m benchmarks.cache_stream --out "$OUT/cache_stream_$i.json" $args "$@" 2>&1 \
      | grep -v "kept in float32" | tail -20 > "$OUT/cache_stream_$i.log"
  done
fi
if [[ $what == cache-exact ]]; then  # issue 37's GPU exactness: streamed cached == resident cached, Flux and Wan (~2.5 min)
  i=0
  for args in "--preset flux --dtype bf16" "--preset wan --dtype bf16 --steps 6 --cache first-block:threshold=0.05"; do
    i=$((i + 1))
    timeout 110 python3 -m benchmarks.cache_stream --out "$OUT/cache_exact_$i.json" $args "$@" 2>&1 \
      | grep -v "kept in float32" | tail -16 > "$OUT/cache_exact_$i.log"
  done
fi
if [[ $what == hiccups ]]; then  # issue 36: what a slow step's time went to (GC, GIL holds), with and without gc.freeze
  python3 -m benchmarks.engine_e2e --write-only --dir /tmp/flux-size 2>&1 | grep -v "kept in float32" | tail -5
  python3 -m benchmarks.step_hiccups --runs 3 --freeze --deadline-s 200 --out "$OUT/step_hiccups.json" "$@" -- \
    --model /tmp/flux-size --device cuda:0 --height 1024 --width 1024 --steps 4 --resident-layers 0 \
    --prompt "a red fox in the snow" --seed 3 2>&1 | grep -v "kept in float32" | tail -60 > "$OUT/step_hiccups.log"
fi
if [[ $what == console ]]; then
  python3 -m benchmarks.console_responsiveness --device cuda --out "$OUT/console.json" "$@" 2>&1 \
    | tail -40 > "$OUT/console.log"
fi
exit 0

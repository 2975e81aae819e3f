"""A request whose forecast needs more memory than this host has is refused before load, in one line.

On the CPU the device is the host: the denoiser's and the VAE's activations are host memory, and a request
past it grows the process until the kernel kills it (no line, no exit code). The size need not be the
operator's: a hostile config's `sample_size` of 3,000 sets a default of 24,000 px a side, a 177 GB VAE
decode. The forecast underestimates rather than over (the demo at 1024x1024: 325 MB forecast, 468 MB
measured growth), so a request it refuses could not have run; one it lets through may still fail, with
the allocator's line (exit 1). On a GPU the host holds the decoded frames, counted here; the host's other
parts (pinned blocks, staged masters) are `--ram-budget`'s to plan.
"""

from __future__ import annotations

from ...offload.units import format_bytes
from ..errors import ConfigError
from ..model_dir.size_bounds import host_bytes
from ..planning.request_forecast import RequestForecast


def check_fits_host(forecast: RequestForecast, device_type: str, host: int | None = None) -> None:
    """Refuse (ConfigError) a request whose forecast host need exceeds `host` bytes (this host's memory)."""
    host = host_bytes() if host is None else host
    needs = [(forecast.peak_bytes, forecast.peak_phase)] if device_type == "cpu" else []
    if forecast.host is not None:  # the decoded frames, on the host whatever the device
        needs.append((forecast.host.part("decoded output"), "vae_decode"))
    if not host or not needs:
        return
    need, phase = max(needs)
    if need <= host:
        return
    fields = [f"--{f}" for f in ("height", "width", "frames") if f in forecast.assumed]
    whose = f"the pipeline's default size, set by its config (no {', '.join(fields)} given)" if fields \
        else "the size asked for"
    raise ConfigError(f"{forecast.size.label()}, {whose}, needs {format_bytes(need)} of host memory at its "
                      f"{phase.replace('_', ' ')} (forecast), more than this host's {format_bytes(host)}: "
                      "ask a smaller size (--height, --width)")

"""A request past this host's memory is refused before load, in one line (exit 2): a config whose
`sample_size` sets a default of 24,000 px a side made `run` load, then grow until the allocator failed
(on a host with more swap or overcommit: until the kernel killed it). A request that fits still runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_console.console.cli import main
from omni_console.engine.planning.host_forecast import HostForecast, HostPart
from omni_console.engine.planning.request_forecast import RequestForecast
from omni_console.engine.planning.request_profile import RequestSize
from omni_console.engine.running.host_fit import check_fits_host

GB = 10**9


def _refused(capsys, argv: list[str], out: Path) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("omni-console: error: ") and "Traceback" not in err, err
    assert not out.exists()
    return err


@pytest.mark.slow  # builds an SD1.5 pipeline
def test_a_config_default_size_past_the_hosts_memory_is_refused_before_load(tmp_path, capsys, monkeypatch):
    from tiny_families_unet import build_tiny_sd15

    from omni_console.engine.engine import Engine

    root = build_tiny_sd15(tmp_path / "sd15")
    config = root / "unet" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "sample_size": 3000}))
    capsys.readouterr()  # the fixture's build progress
    monkeypatch.setattr(Engine, "load", lambda *a, **k: pytest.fail("loaded a request past the host's memory"))
    out = tmp_path / "o.png"
    err = _refused(capsys, ["run", "--model", str(root), "--device", "cpu", "--steps", "1", "--output", str(out)],
                   out)
    assert "24000x24000, the pipeline's default size, set by its config (no --height, --width given), needs " in err
    assert "of host memory at its vae decode (forecast), more than this host's" in err
    assert _refused(capsys, ["plan", "--model", str(root), "--device", "cpu"], out) == err  # plan says the same


@pytest.mark.slow  # a one-step run
def test_a_size_asked_for_past_the_hosts_memory_is_refused_and_one_that_fits_runs(demo_model_dir, tmp_path, capsys):
    out = tmp_path / "o.png"
    base = ["run", "--model", str(demo_model_dir), "--device", "cpu", "--steps", "1", "--output", str(out)]
    err = _refused(capsys, [*base, "--height", "65536", "--width", "65536"], out)
    assert "65536x65536, the size asked for, needs " in err and "ask a smaller size (--height, --width)" in err
    assert main([*base, "--height", "32", "--width", "32"]) == 0 and out.is_file()


def _forecast(device_peak: int, decoded: int, pinned: int = 0) -> RequestForecast:
    parts = (HostPart("decoded output", decoded, ("vae_decode",)), HostPart("pinned blocks", pinned))
    host = HostForecast(phase_peaks={"vae_decode": decoded + pinned}, peak_bytes=decoded + pinned,
                        peak_phase="vae_decode", parts=parts)
    return RequestForecast(size=RequestSize(height=64, width=64), peak_bytes=device_peak, peak_phase="denoise",
                           peak_source="estimated", phase_peaks={"denoise": device_peak}, step_s=None,
                           floor_s=None, step_source="unknown", bandwidth=None, bandwidth_source="unknown", host=host)


@pytest.mark.parametrize(("device", "device_peak", "decoded", "pinned", "refused"), [
    ("cpu", 9 * GB, 1 * GB, 0, True),    # on the CPU the device's activations are host memory
    ("cuda", 9 * GB, 1 * GB, 0, False),  # on a GPU they are not (the device's own OOM line covers them)
    ("cuda", 1 * GB, 9 * GB, 0, True),   # the decoded frames are on the host whatever the device
    ("cuda", 1 * GB, 1 * GB, 9 * GB, False),  # pinned blocks: --ram-budget's to plan, not refused here
    ("cpu", 8 * GB, 8 * GB, 0, False),   # exactly the host's memory: not refused on a forecast
])
def test_what_counts_against_the_hosts_memory(device, device_peak, decoded, pinned, refused):
    forecast = _forecast(device_peak, decoded, pinned)
    if refused:
        with pytest.raises(Exception, match="more than this host's 8.0 GB"):
            check_fits_host(forecast, device, host=8 * GB)
    else:
        check_fits_host(forecast, device, host=8 * GB)
    check_fits_host(forecast, device, host=0)  # the OS did not say: nothing refused

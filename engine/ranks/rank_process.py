"""One rank of a multi-GPU engine: a process that joins torch.distributed and serves one `Engine`.

The process reads its place from the environment exactly as a `torchrun` worker does (`RANK`,
`WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`; `init_method="env://"`), so the
rendezvous on more hosts is a matter of that environment; the leader's command and event queues are
local, so ranks on another host would also need a network channel for those (not built). NCCL on
GPUs (NVLink multicast off unless the operator set it), gloo on CPUs.

It obeys commands from the leader (`engine.ranks.rank_group`) one at a time and answers each with
("ok", rank, result) or ("error", rank, one line). Its engine's events are forwarded to the leader
as they happen, tagged with the rank.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..events import BlockTiming
from ..options import EngineOptions
from ..running.collector import loaded

FORWARD_EVERY_S = 0.05


@dataclass(frozen=True, slots=True)
class RankSpec:
    """What every rank process needs to build its engine (picklable: it crosses the spawn)."""

    model_path: Path
    device_kind: str  # "cuda" or "cpu"
    allgather: bool
    variant: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    parallel: str = "dp"  # "cfg": the DiTs' guided calls are split over the two ranks (engine.ranks.cfg_parallel)
    telemetry_hz: float | None = None  # sample this rank's GPU (allocator, NVML, host) onto its events
    log_dir: Path | None = None  # the rank's stdout and stderr go to a file there (a console owns the terminal)
    options: EngineOptions | None = None  # each rank's engine options (None: the defaults); unset read_threads: shared


def rank_main(rank: int, spec: RankSpec, commands: Any, replies: Any) -> None:
    """Entry point of a rank process (module level: the spawn start method imports it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the whole process group: the leader decides
    gc.disable()  # no full passes while the libraries import and the model loads (engine/running/collector.py)
    if spec.log_dir is not None:
        _output_to_file(spec.log_dir, rank)
    _thread_lock_for_progress_bars()
    os.environ.update(spec.env)
    os.environ["RANK"] = str(rank)
    os.environ.setdefault("LOCAL_RANK", str(rank))
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local}") if spec.device_kind == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method="env://",
                                **({"device_id": device} if device.type == "cuda" else {}))
    except Exception as exc:  # noqa: BLE001 - reported to the leader as one line
        replies.put(("error", rank, f"rank {rank}: cannot join the group: {type(exc).__name__}: {exc}"))
        return
    try:
        _serve(rank, spec, device, commands, replies)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _thread_lock_for_progress_bars() -> None:
    """diffusers' progress bars (tqdm) would take a multiprocessing lock: a named semaphore that a rank
    stopped by the leader (a cancel, a peer's failure) never unlinks, so the leader's resource tracker
    warns at exit, after the one line. A rank's bars are its own: a thread lock does."""
    try:
        from tqdm import tqdm
    except ImportError:  # no progress bars to lock
        return
    tqdm.set_lock(threading.RLock())


def _output_to_file(log_dir: Path, rank: int) -> None:
    """Send this process's fds 1 and 2 (library warnings, tracebacks) to a new file of its own."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"rank{rank}-{os.getppid()}-{os.getpid()}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # a new file: never over another
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _serve(rank: int, spec: RankSpec, device: Any, commands: Any, replies: Any) -> None:
    import torch.distributed as dist

    from ...offload.events import EventBus
    from ..engine import Engine

    bus = EventBus()
    stop = threading.Event()
    forward = _Forwarder(bus.subscribe(), rank, replies)
    forwarder = threading.Thread(target=forward.run, args=(stop,), daemon=True)
    forwarder.start()
    engine = None
    sampler = None
    splits: list[Any] = []
    try:
        world = dist.get_world_size()
        options = spec.options if spec.options is not None else EngineOptions()
        if options.read_threads is None:  # the ranks read at once: share cores
            options = replace(options, read_threads=max(1, (os.cpu_count() or 1) // world))
        engine = Engine(spec.model_path, device=device, bus=bus, variant=spec.variant, options=options,
                        group=dist.group.WORLD if spec.allgather and world > 1 else None)
        engine.prepare()  # the model's classes imported while the group starts: a load only reads
        if spec.telemetry_hz:  # the allocator's numbers exist only in this process: sampled here, forwarded
            from ...offload.telemetry import TelemetrySampler, default_sources

            sampler = TelemetrySampler(*default_sources(device), bus=bus, hz=spec.telemetry_hz)
            sampler.start()
        forward.then(("ok", rank, "ready"))
        while True:
            kind, payload = commands.get()
            if kind == "close":
                break
            try:
                result = _run(engine, kind, payload, splits if spec.parallel == "cfg" else None)
            except Exception as exc:  # noqa: BLE001 - one line to the leader; the leader stops the group
                forward.then(("error", rank, f"rank {rank}: {kind} failed: {type(exc).__name__}: {exc}"))
                traceback.print_exc()
                continue
            forward.then(("ok", rank, result))  # the command's events first
    except Exception as exc:  # noqa: BLE001
        forward.then(("error", rank, f"rank {rank}: {type(exc).__name__}: {exc}"))
    finally:
        if sampler is not None:
            sampler.close()
        if engine is not None:
            engine.close()
        stop.set()
        forwarder.join(timeout=2)


def _run(engine: Any, kind: str, payload: Any, splits: list[Any] | None) -> Any:
    """One command; `splits` (CFG-parallel only) holds the loaded DiTs' `CfgSplit`s between commands."""
    if kind == "load":
        report = engine.load(payload)
        # out of the collector's full passes while loaded: one inside a step would stall this rank, and every rank
        # waits for the slowest at each collective (engine/running/collector.py)
        loaded()
        if splits is not None:
            from .cfg_parallel import CfgSplit

            splits.extend(CfgSplit(getattr(engine.pipe, d.name)) for d in engine.model.dits)
        return report
    if kind == "generate":
        before = [(s.split_steps, s.mispredicted) for s in splits or []]
        result = engine.generate(payload)
        if splits:  # CFG-parallel with a loaded model
            from ...offload.events import LogEvent

            split = sum(s.split_steps for s in splits) - sum(b[0] for b in before)
            missed = sum(s.mispredicted for s in splits) - sum(b[1] for b in before)
            engine.bus.publish(LogEvent(level="info" if split else "warning", message=(
                f"CFG-parallel: {split} DiT call pairs ran at once on two ranks"
                + (f", {missed} computed again (arguments differed from the prediction)" if missed else "")
                + ("" if split else " — the pipeline made no unconditional call (no negative prompt or guidance?)"))))
        return result
    if kind == "unload":
        for split in splits or []:
            split.remove()
        if splits is not None:
            splits.clear()
        gc.unfreeze()  # the released model's cycles: collectable again
        engine.unload()
        return None
    raise ValueError(f"unknown command {kind!r}")


class _Forwarder:
    """Sends this rank's events to the leader every FORWARD_EVERY_S, and before each answer (`then`),
    so a command's events always precede its result."""

    def __init__(self, subscription: Any, rank: int, replies: Any) -> None:
        self.subscription, self.rank, self.replies = subscription, rank, replies
        self.lock = threading.Lock()

    def flush(self, answer: tuple[str, int, Any] | None = None) -> None:
        with self.lock:
            for event in self.subscription.drain():
                if isinstance(event, BlockTiming):  # per block, for a trace: a rank group writes none yet
                    continue
                self.replies.put(("event", self.rank, event))
            if answer is not None:
                self.replies.put(answer)

    def then(self, answer: tuple[str, int, Any]) -> None:
        self.flush(answer)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(FORWARD_EVERY_S):
            self.flush()
        self.flush()

"""The app's start and end: what begins at mount, which frames are held back, and quitting at once.

Part of `OmniConsoleApp` (a mixin over the `ConsoleHost` protocol), kept apart from the app's event and
command glue. At mount the plan screen is shown, the drain timer and telemetry start and the worker imports the
model's classes while the operator reads the plan; the frames before the plan screen has settled are dropped
(`first_paint`).

Quit never waits for the engine: a step of a big video model can run for minutes inside one
kernel. `q` cancels, queues the release behind the command in flight (`EngineWorker.request_shutdown`)
and exits at once, so the terminal is back at once; `app_main.run_app` then gives the release up to
QUIT_RELEASE_WAIT_S and ends the process (the engine thread is a daemon that is never joined).
SIGTERM and SIGHUP take the same path (`quit_on_signal`).
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from textual.screen import Screen

from ..engine.api import plain, probes
from ..themes import register_themes
from .command_done import CommandDone
from .first_paint import FirstPaint
from .shutdown import stop_key_reader

if TYPE_CHECKING:
    from .host import ConsoleHost

DRAIN_INTERVAL_S = 0.1
"""How often the bus is drained; each drain updates each widget at most once."""
QUIT_RELEASE_WAIT_S = 0.8
"""After q has given the terminal back, the process waits at most this long for the engine's release
(it continues on the engine thread; a process that exits first leaves the memory to the OS)."""


class AppLifecycle:
    """Mount, the held first frames, quit (q, ctrl+q, SIGTERM, SIGHUP) and the release it begins."""

    def on_mount(self: ConsoleHost) -> None:
        self._ui_loop = asyncio.get_running_loop()
        if self._quit_pending:  # a signal arrived before the event loop ran
            self.call_later(self.action_quit)
        self.first_paint = FirstPaint(self)  # the start-up frame stays until the plan screen has settled
        register_themes(self, activate=self.initial_theme)
        self.sub_title = plain(self.model.path)
        self.push_screen(self.plan_screen)
        self.request_forecast()  # asked of the engine thread before the imports queue there
        self._drain_timer = self.set_interval(DRAIN_INTERVAL_S, self._tick, name="drain-events")
        if self.start_telemetry:
            self.sampler.sample_now(publish=True)  # the header's free memory before the first tick
            self.sampler.start()
        # the model's classes imported while the operator reads the plan: a load starts reading at once
        # (a class that cannot be imported fails that load, with its one line)
        self.worker.prepare()  # one GPU: imports; several: the rank processes start (and import)
        if self.session.bandwidth is None and self.device_info.is_cuda:
            future = self.worker.call(lambda engine: probes.measure_h2d_bandwidth(engine.device))
            future.add_done_callback(lambda f: self._post_from_worker(CommandDone("bandwidth", f)))

    def _display(self: ConsoleHost, screen: Screen, renderable: Any) -> None:
        """Textual's frame output; the frames before the first screen has settled are dropped (first_paint)."""
        first_paint = getattr(self, "first_paint", None)
        if first_paint is not None:
            if first_paint.holds():
                return
            renderable = first_paint.first_frame(screen, renderable)
        super()._display(screen, renderable)

    def begin_shutdown(self: ConsoleHost) -> Future[None]:
        """Never waits for the engine: stop telemetry, cancel what waits and runs, queue the release (idempotent)."""
        self._closed = True
        self.service.close()
        self.reporter.close()
        return self.release.begin()

    def shutdown(self: ConsoleHost, timeout: float | None = QUIT_RELEASE_WAIT_S) -> bool:
        """`begin_shutdown()`, then wait at most `timeout` s for the release; True when it is done."""
        self._closed = True
        return self.release.wait(timeout)

    async def action_quit(self: ConsoleHost) -> None:
        """q / ctrl+q: cancel, queue the release, exit — the terminal is given back at once.

        Waiting here for the release (the step in flight, then `engine.close()`) kept the screen up
        1–2 s under load; the process's owner waits for it after the terminal is restored instead.
        """
        if not self.session.quit():
            return
        if self._drain_timer is not None:
            self._drain_timer.stop()
        self.begin_shutdown()
        stop_key_reader(self._driver, self.is_headless)
        self.exit(self.session.exit_code)

    def quit_on_signal(self: ConsoleHost, signum: int) -> None:
        """From a signal handler (SIGTERM, SIGHUP): quit like q, exit status 128 + signum.

        Safe in a handler: it only hands a callback to the event loop (`call_soon_threadsafe`);
        the quit itself runs on the UI thread.
        """
        self.session.exit_code = 128 + int(signum)
        loop = self._ui_loop
        if loop is None:
            self._quit_pending = True  # on_mount quits
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the app has already exited
            loop.call_soon_threadsafe(self._quit_from_loop)

    def _quit_from_loop(self: ConsoleHost) -> None:
        if self.is_running:
            self.call_later(self.action_quit)

"""The request service: one owner of a request's lifecycle below the console.

Check a request against the loaded model (`checks`), queue it (`queue`), run one at a time on the
engine's worker, write its outputs atomically (`outputs`), keep a bounded history under the cache dir
(`history`), and publish every state change as a typed event (`events`). `service.RequestService` ties
them together; the TUI and `run` are faces over it.
"""

from . import events as request_events  # the front door's one name for the service's events (engine.api)

__all__ = ["request_events"]

"""`g`: the generate dialog — prompt, steps, size, seed — prefilled with the model's working defaults."""

from __future__ import annotations

from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ...engine.runner import GenerateRequest

MakeRequest = Callable[..., GenerateRequest]
"""`default_request`-like: keyword prompt, steps, height, width, seed → a full request."""


def parse_size(text: str) -> tuple[int | None, int | None]:
    """`WxH` or `N` (square); empty means the model's default. Raises ValueError with the reason."""
    text = text.strip().lower().replace("×", "x")
    if not text:
        return None, None
    parts = text.split("x")
    if len(parts) == 1:
        parts = parts * 2
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"size must be WxH or N, got {text!r}")
    width, height = (int(p) for p in parts)
    if width <= 0 or height <= 0:
        raise ValueError("size must be positive")
    return width, height


class GenerateDialog(ModalScreen[GenerateRequest | None]):
    """Collects a request; Enter in any field or the button submits, Esc cancels."""

    DEFAULT_CSS = """
    GenerateDialog { align: center middle; }
    GenerateDialog > Vertical {
        width: 72; height: auto; max-height: 100%; border: round $accent; background: $surface; padding: 0 1;
    }
    GenerateDialog Horizontal.field { height: 3; }
    GenerateDialog .field-label { width: 10; padding-top: 1; }
    GenerateDialog Input { width: 1fr; }
    GenerateDialog #gen-error { color: $error; height: auto; }
    GenerateDialog #gen-buttons { height: 3; align-horizontal: right; }
    """

    BINDINGS = [Binding("escape", "cancel", "cancel", id="generate.cancel")]

    def __init__(self, defaults: GenerateRequest, make_request: MakeRequest) -> None:
        super().__init__()
        self.defaults = defaults
        self.make_request = make_request
        self.error = ""

    def compose(self) -> ComposeResult:
        d = self.defaults
        size = f"{d.width}x{d.height}" if d.width and d.height else ""
        with Vertical() as box:
            box.border_title = "generate (Enter runs, Esc cancels)"
            for label, field_id, value, kind, placeholder in (
                ("prompt", "prompt", d.prompt, "text", "a prompt"),
                ("steps", "steps", "" if d.steps is None else str(d.steps), "integer", "model default"),
                ("size", "size", size, "text", "WxH (model default)"),
                ("seed", "seed", str(d.seed), "integer", "0"),
            ):
                with Horizontal(classes="field"):
                    yield Label(label, classes="field-label")
                    yield Input(value, placeholder=placeholder, id=field_id, type=kind)
            yield Static("", id="gen-error", markup=False)
            with Horizontal(id="gen-buttons"):
                yield Button("Generate", id="go", variant="primary")
                yield Button("Cancel", id="cancel")

    def build(self) -> GenerateRequest:
        """The request from the fields; ValueError with the reason when a field is bad."""
        prompt = self.query_one("#prompt", Input).value
        steps_text = self.query_one("#steps", Input).value.strip()
        steps = int(steps_text) if steps_text else None
        if steps is not None and steps < 1:
            raise ValueError("steps must be >= 1")
        width, height = parse_size(self.query_one("#size", Input).value)
        seed_text = self.query_one("#seed", Input).value.strip()
        seed = int(seed_text) if seed_text else 0
        return self.make_request(prompt=prompt, steps=steps, height=height, width=width, seed=seed)

    def submit(self) -> None:
        try:
            request = self.build()
        except ValueError as exc:
            self.error = str(exc)
            self.query_one("#gen-error", Static).update(self.error)
            return
        self.dismiss(request)

    @on(Input.Submitted)
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    @on(Button.Pressed, "#go")
    def _go(self) -> None:
        self.submit()

    @on(Button.Pressed, "#cancel")
    def _cancel_button(self) -> None:
        self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)

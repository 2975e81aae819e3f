"""`g`: the generate dialog — the fields the loaded pipeline takes, checked before anything starts.

Which fields, their prefilled values and the checks come from `console.generate_form.RequestForm`;
this screen lays them out (one compact row each, so even a video pipeline's nine fields fit an
80x24 terminal) and shows a refusal under the fields instead of starting the request.
"""

from __future__ import annotations

from collections.abc import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ...engine.api import GenerateRequest, plain_lines
from ...engine.errors import ConfigError
from ..generate_form import RequestForm, parse_size
from ..widgets.plain_input import PlainInput

__all__ = ["GenerateDialog", "parse_size"]


class GenerateDialog(ModalScreen[GenerateRequest | None]):
    """Collects a request; Enter in any field or the button submits, Esc cancels."""

    DEFAULT_CSS = """
    GenerateDialog { align: center middle; }
    GenerateDialog > Vertical {
        width: 72; height: auto; max-height: 100%; border: round $accent; background: $surface; padding: 0 1;
    }
    GenerateDialog Horizontal.field { height: 1; margin-bottom: 0; }
    GenerateDialog .field-label { width: 12; }
    GenerateDialog Input { width: 1fr; }
    GenerateDialog #gen-forecast { height: auto; margin-top: 1; color: $text-muted; }
    GenerateDialog #gen-error { color: $error; height: auto; }
    GenerateDialog #gen-buttons { height: 3; align-horizontal: right; }
    """

    BINDINGS = [Binding("escape", "cancel", "cancel", id="generate.cancel")]

    def __init__(self, form: RequestForm,
                 forecast: Callable[[GenerateRequest], str] = lambda _request: "") -> None:
        """`forecast`: the line saying how long the request as filled in will take (updated as it is edited)."""
        super().__init__()
        self.form = form
        self.forecast = forecast
        self.field_ids = [f.id for f in form.fields()]
        self.error = ""
        self.forecast_text = ""

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = f"generate · {self.form.model.pipeline_class} (Enter runs, Esc cancels)"
            for spec in self.form.fields():
                with Horizontal(classes="field", id=f"field-{spec.id}"):
                    yield Label(spec.label, classes="field-label")
                    yield PlainInput(spec.value, placeholder=spec.placeholder, id=spec.id, type=spec.kind, compact=True)
            yield Static("", id="gen-forecast", markup=False)
            yield Static("", id="gen-error", markup=False)
            with Horizontal(id="gen-buttons"):
                yield Button("Generate", id="go", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.show_forecast()

    @on(Input.Changed)
    def _changed(self) -> None:
        self.show_forecast()

    def show_forecast(self) -> None:
        """The forecast of the request as it stands; a field that does not parse yet leaves it unknown. Also
        called by the app when the engine thread's forecast arrives."""
        try:
            text = self.forecast(self.build())
        except NoMatches:  # an Input's first Changed can come before its siblings are mounted
            return
        except (ValueError, ConfigError):
            text = "forecast: fill in the fields to see it"
        self.forecast_text = text
        self.query_one("#gen-forecast", Static).update(text)

    def values(self) -> dict[str, str]:
        """Each shown field's text, by field id."""
        return {field_id: self.query_one(f"#{field_id}", Input).value for field_id in self.field_ids}

    def build(self) -> GenerateRequest:
        """The checked request; ValueError or ConfigError with the reason when a field is bad."""
        return self.form.build(self.values())

    def submit(self) -> None:
        try:
            request = self.build()
        except (ValueError, ConfigError) as exc:
            self.error = str(exc)
            self.query_one("#gen-error", Static).update(plain_lines(self.error))
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

"""The console's screens: plan (before load), live (after load), and the dialogs."""

from .copy_command import CopyCommandScreen
from .generate import GenerateDialog
from .help import HelpScreen
from .live import LiveScreen
from .plan import PlanScreen

__all__ = ["CopyCommandScreen", "GenerateDialog", "HelpScreen", "LiveScreen", "PlanScreen"]

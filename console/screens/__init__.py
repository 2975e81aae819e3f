"""The console's screens: plan (before load), live (after load), and the dialogs."""

from .copy_command import CopyCommandScreen
from .generate import GenerateDialog
from .help import HelpScreen
from .history import HistoryScreen
from .live import LiveScreen
from .notice_log import NoticeLogScreen
from .plan import PlanScreen

__all__ = ["CopyCommandScreen", "GenerateDialog", "HelpScreen", "HistoryScreen", "LiveScreen", "NoticeLogScreen",
           "PlanScreen"]

"""Formatting for engine reports and views: the offload layer's decimal units under short names."""

from ..offload.units import format_bytes as fmt_bytes
from ..offload.units import format_rate as fmt_rate
from ..offload.units import format_seconds as fmt_seconds

__all__ = ["fmt_bytes", "fmt_rate", "fmt_seconds"]

"""Fast paths for loops that training scripts write in Python, each beside the reference loop it is tested against."""

from .linear_attention import linear_attention, linear_attention_reference
from .scan import linear_recurrence, linear_recurrence_reference, linear_scan, linear_scan_reference

__all__ = [
    "linear_attention",
    "linear_attention_reference",
    "linear_recurrence",
    "linear_recurrence_reference",
    "linear_scan",
    "linear_scan_reference",
]

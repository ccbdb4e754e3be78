"""Fast paths for loops that training scripts write in Python, each beside the reference loop it is tested against."""

from .scan import linear_scan, linear_scan_reference

__all__ = ["linear_scan", "linear_scan_reference"]

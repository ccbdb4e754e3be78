"""Benchmarks of perfmod itself (robustness over real code, tool speed) and of
the runtime; their recorded results are in BENCHMARKS.md."""

"""Benchmarks that print figures: `make bench`, or `python -m bench.run [rest|turns|...]` from the repository root."""

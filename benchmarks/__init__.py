"""recordforge's benchmark harness (not installed with the package): `python -m benchmarks`."""

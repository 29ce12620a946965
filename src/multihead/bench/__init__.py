"""Benchmarks, run from the CLI as `multihead bench ...`."""

"""Helpers that the tests and the benchmarks share: tiny models, processes, load, clusters, fuzzing."""

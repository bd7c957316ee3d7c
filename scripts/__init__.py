"""Maintainer tools that are not benchmarks: a local multi-node cluster, the API fuzzer, the model card writer."""

"""Decoding: the batched search over a KV cache (search.py) and the continuous scheduler's rows joining and leaving
at every step (scheduler.py), both stepping through model.runtime's compiled or eager step."""

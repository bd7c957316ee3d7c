"""Decoding: the batched search (search.py) and the continuous scheduler (scheduler.py), both on one decode loop
(loop.py: the compiled loop of model.runtime's compiled step, or the same loop in Python over the eager or graph
step, its rows in rows.py's ragged cache), each request stepping through beam.py's beam step."""

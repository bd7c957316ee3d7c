"""Explanations: forced decoding and the attention arithmetic (explain.py), attributions (attribution.py), alignments
from attention rows (alignment.py) and the two models' agreed alignment (agreement.py). They read the lecture
network (model.transformer) and import nothing of decoding."""

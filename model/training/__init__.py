"""Offline tools: training, data reading, evaluation, alignment scoring against gold. Serving never imports this."""

"""Schedulers, Triton's: requests straight to a free instance (scheduler.py, with the batch runner all share),
the dynamic batcher (dynamic.py) and the sequence batcher (sequence.py)."""

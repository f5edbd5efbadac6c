"""Training infrastructure, kept apart from the model: the loop, checkpoints, distributed setup, logging."""

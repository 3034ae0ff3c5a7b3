"""Training machinery used by train.py: checkpoints, RNG state, optimizer and schedule, logging, the CLI wrapper."""

"""Training and evaluation machinery shared by train.py, eval.py and scripts/."""

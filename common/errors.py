"""The one exception type for mistakes a user can fix (bad config, missing file, wrong checkpoint).

Entry points (train.py, eval.py, scripts) print its message as a single line and exit non-zero;
anything else is a bug and keeps its traceback. Also here, torch-free so that launchers can read
it: the exit status of a training stopped by a non-finite loss.
"""

EXIT_NONFINITE = 3  # train.py after a non-finite loss (training/train_step.py); compare_heads --tune: a diverged trial


class UserError(ValueError):
    """A problem with the user's input; the message says what is wrong and how to fix it."""

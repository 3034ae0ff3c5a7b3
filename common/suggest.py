"""'Did you mean …?' for a mistyped name: the one rule for config keys, config values and every choice
flag (--heads, --ood-dataset, ...). Standard library only, so a command can answer before torch loads."""
import argparse
import difflib

from .errors import UserError

# How close a typo must be to a valid name (difflib ratio) to be suggested: below it, a suggestion
# is more often wrong than right (learning_rate is not optim.clip_grad).
SUGGEST_CUTOFF = 0.8


def closest(candidates, score):
    """The best-scoring candidate when it is close enough to suggest (its score's first element, a
    difflib ratio, >= SUGGEST_CUTOFF), else None."""
    best = max(candidates, key=score, default=None)
    return best if best is not None and score(best)[0] >= SUGGEST_CUTOFF else None


def suggest_value(value, choices):
    """'; did you mean 'sparsemax'?' for a value close to one of `choices` ('' when none is)."""
    text = str(value)
    hint = closest(choices, lambda c: (difflib.SequenceMatcher(None, text, str(c)).ratio(),))
    return f"; did you mean '{hint}'?" if hint is not None else ""



def one_of(choices):
    """An argparse `action=` for a choice flag: a value outside `choices` is a one-line UserError
    naming the flag, with the closest choice suggested (argparse's own `choices=` prints its usage
    and suggests nothing). Pass `metavar=choice_metavar(choices)` to keep the choices in --help."""
    choices = tuple(choices)

    class OneOf(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None):
            for value in values if isinstance(values, list) else [values]:
                if value not in choices:
                    raise UserError(f"unknown {option_string} '{value}'{suggest_value(value, choices)}; valid: "
                                    f"{', '.join(choices)}")
            setattr(namespace, self.dest, values)

    return OneOf


def choice_metavar(choices):
    return "{" + ",".join(choices) + "}"

"""The output heads' hyperparameter checks and vocabularies, importable without torch: the head
declarations (models/registry.py) and the config loader read them before torch loads, and each
head's module (am_softmax, normmax, taylor_softmax, topk_softmax, perturbmax) checks with the same
objects. A number's check is a common.intervals.RangeCheck, whose `.range` is the text
--help-config shows."""
import math

from common.errors import UserError
from common.intervals import RangeCheck

# The alpha of the entmax family's fixed members (one source: the losses, the registry and the
# dispatch of a float alpha in models/mappings.py read it from here).
ALPHA_OF = {"softmax": 1.0, "entmax15": 1.5, "sparsemax": 2.0}

check_alpha = RangeCheck("head.alpha", float, "[1, 2]", "1 = softmax, 2 = sparsemax")
check_gamma_value = RangeCheck("head.gamma", float, "(1, inf)", "2 is the paper's default")
check_order = RangeCheck("head.order", int, "[2, 64]", "Taylor softmax is only positive for even orders",
                         extra=(lambda order: order % 2 == 0, "even"))
check_scale = RangeCheck("head.scale", float, "(0, inf)", "the paper uses 30")
check_margin = RangeCheck("head.margin", float, "[0, inf)", "the paper uses 0.35")
_check_k_at_least_one = RangeCheck("head.k", int, "[1, inf)", "the number of classes kept by sparse_softmax")


def check_flag(key: str):
    def check(value) -> bool:
        if not isinstance(value, bool):
            raise UserError(f"head.{key} must be true or false, got {value!r}")
        return value
    return check


def check_k(k, num_classes=None) -> int:
    """k as an int >= 1 and, given the class count, at most that (one UserError line otherwise)."""
    k = _check_k_at_least_one(k)
    if num_classes is not None and k > num_classes:
        raise UserError(f"head.k={k} exceeds the number of classes ({num_classes}); "
                        f"set head.k to at most {num_classes}")
    return k


# ------------------------------------------------------------------------------- perturbmax
NOISES = ("gaussian", "gumbel")
LOGIT_SCALE = 100.0  # the |logit| up to which sigma * noise must stay resolvable (the sigma floor)
RESOLUTION_STEPS = 100  # sigma spans this many of the dtype's spacings there: ties of perturbed values < ~0.5%
# the machine epsilon of the compute dtypes (torch.finfo(dtype).eps; tests/test_perturbmax.py checks)
EPS = {"float32": 2.0 ** -23, "float64": 2.0 ** -52}


def sigma_floor(eps: float) -> float:
    """Smallest sigma whose noise a dtype of machine epsilon `eps` resolves next to logits up to
    +-LOGIT_SCALE: RESOLUTION_STEPS times the dtype's spacing there (at most eps * LOGIT_SCALE),
    rounded up to two significant figures (the range --help-config shows is the one checked)."""
    exact = RESOLUTION_STEPS * eps * LOGIT_SCALE
    unit = 10.0 ** (math.floor(math.log10(exact)) - 1)
    return float(f"{math.ceil(exact / unit) * unit:.2g}")


def _sigma_check(dtype: str) -> RangeCheck:
    return RangeCheck("head.sigma", float, f"[{sigma_floor(EPS[dtype]):g}, inf)",
                      f"the noise scale, 1 = Gumbel-softmax; smaller, {dtype} cannot resolve the noise next "
                      f"to logits up to +-{LOGIT_SCALE:g}, and perturbed logits tie, broken by class index")


# the declared range: float32's floor, the compute dtype of fp32/bf16/fp16 logits
check_sigma = _sigma_check("float32")
check_sigma_float64 = _sigma_check("float64")
check_samples = RangeCheck("head.samples", int, "[1, 1048576]", "Monte-Carlo draws per row")


def check_noise(noise) -> str:
    if noise not in NOISES:
        raise UserError(f"head.noise must be one of {', '.join(NOISES)}, got {noise!r}")
    return noise

"""The declared OOD scores: one row per score (name, what it reads, its report label, why a higher value
means more in-distribution, its reference), as the head and dataset registries declare theirs.

Every OOD score is oriented so that HIGHER means MORE in-distribution (evaluation/ood.py: ID examples
are the positives of AUROC and FPR@95%TPR). The scores are computed by evaluation/ood.py (from the
head's probabilities) and evaluation/ood_scores.py (from the logits and from a memory of training
features); the tuples below are the one source of their names, order and labels for those modules,
eval.py's flags and the reports. A score that `reads_head=False` reads only the penultimate features
and the memory: on cached features (data.dataset=features) those are the backbone's, shared by every
head and seed, so the comparison report shows such a score once (comparison/report/document.py).

The modern-Hopfield energy of a query ξ against stored patterns X is E(ξ) = −lse_β(Xξ) + ½‖ξ‖² + const
(Ramsauer et al., ICLR 2021); the Hopfield scores are MINUS that energy (and minus its Fenchel–Young
counterparts), so that a low energy (a query near stored patterns) scores high. Standard library only.
"""
from dataclasses import dataclass

PROBABILITIES, LOGITS, MEMORY = "probabilities", "logits", "memory"


@dataclass(frozen=True)
class OODScore:
    name: str
    reads: str  # PROBABILITIES | LOGITS | MEMORY (penultimate features against stored training features)
    label: str  # in reports and plots
    orientation: str  # why higher = more in-distribution
    reference: str
    sparse_only: bool = False  # a score of sparse heads only (softmax's support is always every class)
    reads_head: bool = True  # False: the features and the memory alone, no head output (the same for
    # every head on cached features; SHE reads the head's predicted class, so it stays True)


OOD_SCORES = (
    OODScore("max_prob", PROBABILITIES, "max probability", "a confident prediction is more ID",
             "Hendrycks & Gimpel, ICLR 2017"),
    OODScore("neg_entropy", PROBABILITIES, "entropy", "minus the Shannon entropy: a peaked distribution is more ID",
             "Hendrycks & Gimpel, ICLR 2017"),
    OODScore("neg_support", PROBABILITIES, "support size", "minus the support size: a small prediction set is "
             "more ID (the hope for sparse heads)", "Martins & Astudillo, ICML 2016 (sparsemax)", sparse_only=True),
    OODScore("energy", LOGITS, "energy", "minus the free energy, T·logsumexp(z/T): large logits are more ID",
             "Liu et al., NeurIPS 2020"),
    OODScore("max_logit", LOGITS, "max logit", "the largest logit", "Hendrycks et al., ICML 2022"),
    OODScore("hopfield_softmax", MEMORY, "−Hopfield energy", "minus the modern-Hopfield energy E = −lse_β(Xξ) + "
             "½‖ξ‖², i.e. lse_β(Xξ) − ½‖ξ‖²: a query close to stored patterns (low energy) is more ID",
             "Ramsauer et al., ICLR 2021", reads_head=False),
    OODScore("hopfield_sparsemax", MEMORY, "−Hopfield sparsemax energy", "minus the same energy with sparsemax's "
             "Fenchel–Young conjugate in place of lse", "Santos et al., ICML 2024 / JMLR 2025", reads_head=False),
    OODScore("hopfield_entmax15", MEMORY, "−Hopfield 1.5-entmax energy", "minus the same energy with 1.5-entmax's "
             "Fenchel–Young conjugate in place of lse", "Santos et al., ICML 2024 / JMLR 2025", reads_head=False),
    # was "hopfield_support", −count: renamed with the sign, so that an eval.json of before (which a comparison
    # reuses) shows under its old name and is never averaged into this score
    OODScore("hopfield_retrieved", MEMORY, "retrieval support", "PLUS the number of stored patterns a sparsemax "
             "retrieval of ξ keeps (those within about 1/β in cosine of its best matches): an ID query sits among "
             "many near-equal training neighbours, an OOD query has fewer (exact one-pattern retrieval needs a "
             "separation margin that a memory of training features does not have)",
             "the retrieval is Santos et al., ICML 2024 (sparse Hopfield retrieval); no paper claims this "
             "direction for OOD detection: chosen on a synthetic clustered memory and checked on trained "
             "features (docs/evaluation.md)", reads_head=False),
    OODScore("she", MEMORY, "SHE", "ξ · m_ŷ: similarity to the predicted class's stored pattern",
             "Zhang et al., ICLR 2023"),
    OODScore("knn", MEMORY, "kNN", "minus the distance to the k-th nearest normalised training feature",
             "Sun et al., ICML 2022", reads_head=False),
)
_BY_NAME = {score.name: score for score in OOD_SCORES}
assert len(_BY_NAME) == len(OOD_SCORES), "an OOD score is declared twice"


def score_names(reads):
    """The declared scores that read `reads`, in declaration order."""
    return tuple(score.name for score in OOD_SCORES if score.reads == reads)


def score_label(name):
    """The report label of a declared score (an undeclared name is shown as it is)."""
    return _BY_NAME[name].label if name in _BY_NAME else name


PROBABILITY_SCORES = score_names(PROBABILITIES)
LOGIT_SCORES = score_names(LOGITS)
MEMORY_SCORES = score_names(MEMORY)
HOPFIELD_SCORES = tuple(name for name in MEMORY_SCORES if name.startswith("hopfield_"))
HEAD_FREE_SCORES = tuple(score.name for score in OOD_SCORES if not score.reads_head)

"""The OOD scores beyond the output probabilities (evaluation/ood.py has those): from the logits, and
from penultimate features against a memory of stored training patterns. Every score is oriented
like ood.py's: HIGHER means MORE in-distribution.

From the logits z (any head: only the logits are needed):
  - "energy": T·logsumexp(z / T), minus the free energy of Liu et al., "Energy-based
    Out-of-distribution Detection", NeurIPS 2020 (T = --ood-temperature, default 1; T → 0 gives
    max logit);
  - "max_logit": max_c z_c (Hendrycks et al., "Scaling Out-of-Distribution Detection for
    Real-World Settings", ICML 2022).

From the penultimate feature ξ of a query and the memory X (n × d) of training features:
  - "hopfield_softmax": MINUS the modern-Hopfield energy E(ξ) = −lse_β(X ξ) + ½‖ξ‖² (Ramsauer et
    al., "Hopfield Networks is All You Need", ICLR 2021; constants dropped), i.e. the score is
    lse_β(X ξ) − ½‖ξ‖², with lse_β(v) = β⁻¹ log Σ exp(β v_i);
  - "hopfield_sparsemax", "hopfield_entmax15": minus the same energy with the Fenchel–Young
    conjugate Ω*(βXξ)/β of sparsemax / 1.5-entmax in place of lse (Hopfield–Fenchel–Young energies,
    Santos et al., ICML 2024 / JMLR 2025): Ω*(s) = ⟨s, p⟩ − Ω(p), p = the mapping of s, Ω the
    Tsallis entropy regularizer ((Σp^α − 1)/(α(α − 1)), α = 2 or 1.5);
  - "hopfield_retrieved": PLUS the number of stored patterns the sparsemax retrieval p =
    sparsemax(βXξ) keeps. With the similarities sorted, s_(1) ≥ s_(2) ≥ …, pattern (k) is kept
    exactly when Σ_{j<k} (s_(j) − s_(k)) < 1: the count of training features nearly as similar
    to ξ as its best matches (within about 1/β in cosine). An ID query sits among many near-equal
    neighbours of its class, an OOD query has fewer. The opposite hope (ID queries retrieve one
    pattern exactly) needs the separation margin of Santos et al.'s exact-retrieval result, which
    a memory of raw training features, full of near-duplicates, does not have. No paper states
    this direction for OOD detection; it was chosen on a synthetic clustered memory and checked
    on other OOD kinds and on trained features (tests/test_ood_scores.py, docs/evaluation.md);
  - "she": ξ · m_ŷ, the stored pattern of the predicted class, where m_c is the mean training
    feature of the correctly classified training images of class c (Zhang et al., "Out-of-
    Distribution Detection based on In-Distribution Data Patterns Memorization with Modern Hopfield
    Energy", ICLR 2023; raw features, as there);
  - "knn": minus the Euclidean distance from the L2-normalised ξ to its k-th nearest L2-normalised
    memory feature (Sun et al., "Out-of-Distribution Detection with Deep Nearest Neighbors", ICML
    2022; k = KNN_K, or n when the memory is smaller).
The Hopfield scores use L2-normalised patterns and queries (so ½‖ξ‖² = ½ for every query and β
is an inverse temperature on cosine similarities, HOPFIELD_BETA); SHE uses raw features.

Pure functions on torch tensors: the similarity matrix products in float32 (cosines to ~1e-7,
4-8x faster on CPUs than float64 at a 50k-image memory), everything after them in float64; queries
in chunks so that the (chunk × n) similarity block stays small; no I/O, no model.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from common.errors import UserError
from models.mappings import entmax15, sparsemax

from .ood_table import HOPFIELD_SCORES, LOGIT_SCORES, MEMORY_SCORES

KNN_K = 50  # Sun et al.'s choice for CIFAR-10 with the whole training set
HOPFIELD_BETA = 10.0  # on cosine similarities in [-1, 1]
CHUNK = 256  # queries per similarity block
DEFAULT_TEMPERATURE = 1.0


def check_temperature(t) -> float:
    try:
        t = float(t)
    except (TypeError, ValueError):
        raise UserError(f"--ood-temperature must be a number > 0, got {t!r}") from None
    if not (math.isfinite(t) and t > 0):
        raise UserError(f"--ood-temperature must be a finite number > 0 (1: the energy score of Liu et al.), got {t}")
    return t


def logit_scores(logits, temperature: float = DEFAULT_TEMPERATURE) -> dict:
    """{energy, max_logit} of each row of logits (N, K) -> float64 numpy (N,)."""
    t = check_temperature(temperature)
    z = torch.as_tensor(logits).double()
    m = z.amax(-1)
    energy = m + t * torch.logsumexp((z - m.unsqueeze(-1)) / t, -1)  # shifted: exact at any T
    return dict(zip(LOGIT_SCORES, (energy.numpy(), m.numpy())))


def normalise(features) -> torch.Tensor:
    """Rows scaled to unit L2 norm (a zero row stays zero), float32 (computed in float64)."""
    f = torch.as_tensor(features).double()
    return (f / f.norm(dim=-1, keepdim=True).clamp(min=1e-12)).float()


def _tsallis_conjugate(s: torch.Tensor, alpha: float) -> torch.Tensor:
    """Ω*(s) = ⟨s, p⟩ − Ω(p) per row for Ω the Tsallis regularizer of alpha (2: sparsemax, 1.5: entmax)."""

    p = sparsemax(s, -1) if alpha == 2.0 else entmax15(s, -1)
    omega = (p.pow(alpha).sum(-1) - 1.0) / (alpha * (alpha - 1.0))
    return (s * p).sum(-1) - omega, p


def _chunks(n):
    for lo in range(0, n, CHUNK):
        yield slice(lo, min(lo + CHUNK, n))


def hopfield_scores(queries, memory, beta: float = HOPFIELD_BETA) -> dict:
    """The four Hopfield scores of each query (module docstring) against the memory patterns."""
    q, x = normalise(queries), normalise(memory)
    out = {name: np.empty(q.shape[0]) for name in HOPFIELD_SCORES}
    for sl in _chunks(q.shape[0]):
        s = beta * (q[sl] @ x.T).double()
        half = 0.5 * (q[sl].double() ** 2).sum(-1)
        out["hopfield_softmax"][sl] = (torch.logsumexp(s, -1) / beta - half).numpy()
        conj, p = _tsallis_conjugate(s, 2.0)
        out["hopfield_sparsemax"][sl] = (conj / beta - half).numpy()
        out["hopfield_retrieved"][sl] = (p > 0).sum(-1).double().numpy()  # more kept patterns = more ID
        out["hopfield_entmax15"][sl] = (_tsallis_conjugate(s, 1.5)[0] / beta - half).numpy()
    return out


def class_patterns(features, labels, preds, num_classes: int) -> torch.Tensor:
    """SHE's stored patterns (K, d): the mean feature of the correctly classified training images of
    each class (a zero pattern for a class with none)."""
    f = torch.as_tensor(features).double()
    labels, preds = torch.as_tensor(labels).long(), torch.as_tensor(preds).long()
    right = labels == preds
    sums = torch.zeros(num_classes, f.shape[1], dtype=torch.float64).index_add_(0, labels[right], f[right])
    counts = torch.bincount(labels[right], minlength=num_classes).double().clamp(min=1.0)
    return sums / counts.unsqueeze(-1)


def she_score(queries, preds, patterns) -> np.ndarray:
    """ξ · m_ŷ per query (raw features; preds are the queries' predicted classes)."""
    q = torch.as_tensor(queries).double()
    return (q * torch.as_tensor(patterns).double()[torch.as_tensor(preds).long()]).sum(-1).numpy()


def knn_score(queries, memory, k: int = KNN_K) -> np.ndarray:
    """Minus the distance of each normalised query to its k-th nearest normalised memory feature."""
    q, x = normalise(queries), normalise(memory)
    k = max(1, min(int(k), x.shape[0]))
    out = np.empty(q.shape[0])
    for sl in _chunks(q.shape[0]):
        kth = (q[sl] @ x.T).topk(k, -1).values[:, -1].double()  # the k-th largest cosine similarity
        out[sl] = (-(2.0 - 2.0 * kth).clamp(min=0.0).sqrt()).numpy()  # ‖a − b‖² = 2 − 2 a·b for unit rows
    return out


def memory_scores(queries, preds, memory) -> dict:
    """Every feature-memory score of the queries (N, d) with predicted classes (N,) against a memory
    {"features" (n, d), "labels" (n,), "preds" (n,), "num_classes"} (evaluation/feature_memory.py)."""
    out = hopfield_scores(queries, memory["features"])
    patterns = class_patterns(memory["features"], memory["labels"], memory["preds"], memory["num_classes"])
    out["she"] = she_score(queries, preds, patterns)
    out["knn"] = knn_score(queries, memory["features"])
    return {name: out[name] for name in MEMORY_SCORES}

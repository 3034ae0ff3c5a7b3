"""The logit and feature-memory OOD scores (evaluation/ood_scores.py) against direct numpy
computations from their papers' formulas, their limits, and the stored feature memory
(evaluation/feature_memory.py): reused only for the same weights, request and contents."""
import os

import numpy as np
import pytest
import torch

from common.errors import UserError
from evaluation import feature_memory, ood_scores

RNG = np.random.default_rng(0)
LOGITS = RNG.normal(size=(7, 5)) * 3
MEMORY = RNG.normal(size=(40, 6)) + 0.5
QUERIES = RNG.normal(size=(9, 6)) + 0.5


def np_unit(a):
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def np_sparsemax(s):
    """Martins & Astudillo 2016, Algorithm 1 (numpy, one row)."""
    z = np.sort(s)[::-1]
    cs = np.cumsum(z) - 1
    k = np.arange(1, s.size + 1)
    kk = k[z - cs / k > 0][-1]
    return np.maximum(s - cs[kk - 1] / kk, 0)


def np_entmax15(s):
    """p = [s/2 - tau]_+^2, sum p = 1, tau by bisection to float64 resolution (numpy, one row)."""
    z = s / 2
    lo, hi = z.max() - 1, z.max()
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (np.maximum(z - mid, 0) ** 2).sum() >= 1 else (lo, mid)
    return np.maximum(z - lo, 0) ** 2


def test_energy_and_max_logit_against_numpy():
    got = ood_scores.logit_scores(LOGITS, temperature=2.0)
    want = 2.0 * np.log(np.exp(LOGITS / 2.0).sum(1))
    np.testing.assert_allclose(got["energy"], want, rtol=1e-12)
    np.testing.assert_array_equal(got["max_logit"], LOGITS.max(1))
    masked = LOGITS.copy()
    masked[:, 0] = -np.inf  # a masked class adds nothing
    np.testing.assert_allclose(ood_scores.logit_scores(masked)["energy"], np.log(np.exp(LOGITS[:, 1:]).sum(1)),
                               rtol=1e-12)


def test_energy_at_zero_temperature_is_the_max_logit():
    for t in (1e-3, 1e-6):
        np.testing.assert_allclose(ood_scores.logit_scores(LOGITS, t)["energy"], LOGITS.max(1), atol=10 * t)
    for bad in (0, -1, float("nan"), "x"):
        with pytest.raises(UserError, match="--ood-temperature"):
            ood_scores.logit_scores(LOGITS, bad)


def test_hopfield_scores_against_numpy():
    beta = ood_scores.HOPFIELD_BETA
    got = ood_scores.hopfield_scores(QUERIES, MEMORY)
    q, x = np_unit(QUERIES), np_unit(MEMORY)
    for i in range(q.shape[0]):
        s = beta * x @ q[i]
        half = 0.5 * q[i] @ q[i]
        assert got["hopfield_softmax"][i] == pytest.approx(np.log(np.exp(s).sum()) / beta - half, abs=1e-5)
        p = np_sparsemax(s)  # Omega*(s) = <s, p> - (sum p^2 - 1) / 2
        assert got["hopfield_sparsemax"][i] == pytest.approx((s @ p - ((p ** 2).sum() - 1) / 2) / beta - half, abs=1e-5)
        assert got["hopfield_retrieved"][i] == np.count_nonzero(p)  # plus the count: more kept = more ID
        p = np_entmax15(s)  # Omega*(s) = <s, p> - (sum p^1.5 - 1) / 0.75
        assert got["hopfield_entmax15"][i] == pytest.approx((s @ p - ((p ** 1.5).sum() - 1) / 0.75) / beta - half,
                                                            abs=1e-5)
    assert (got["hopfield_retrieved"] > 1).any()  # some queries retrieve several patterns, not all one


def test_retrieval_support_is_the_count_of_near_equal_best_matches():
    """Sparsemax keeps the k-th most similar pattern exactly when the gaps of the better ones to it sum
    below 1 (Martins & Astudillo 2016, eq. 4 / Algorithm 1): Σ_{j<k} β(cos_(j) − cos_(k)) < 1."""
    beta = ood_scores.HOPFIELD_BETA
    got = ood_scores.hopfield_scores(QUERIES, MEMORY)["hopfield_retrieved"]
    q, x = np_unit(QUERIES), np_unit(MEMORY)
    for i in range(q.shape[0]):
        s = np.sort(beta * x @ q[i])[::-1]
        gaps = np.cumsum(s) - np.arange(1, s.size + 1) * s  # Σ_{j≤k} (s_(j) − s_(k))
        assert got[i] == np.count_nonzero(gaps < 1)
    twins = np.repeat(MEMORY[:1], 5, axis=0)  # five copies of one pattern: a query on it keeps all five
    assert ood_scores.hopfield_scores(MEMORY[:1], np.vstack([twins, -MEMORY[1:]]))["hopfield_retrieved"][0] == 5


def clustered(g, centres, n, spread=0.5):
    """n points around the unit centres (labels cycling), Gaussian noise of norm about `spread`."""
    d = centres.shape[1]
    return centres[torch.arange(n) % centres.shape[0]] + spread * torch.randn(n, d, generator=g) / d ** 0.5


def unit_centres(g, k, d):
    c = torch.randn(k, d, generator=g)
    return c / c.norm(dim=1, keepdim=True)


def test_retrieval_support_orientation_chosen_on_a_synthetic_clustered_memory():
    """Where the sign was chosen: a memory of 10 class clusters, ID queries drawn from them, OOD queries
    from 10 new clusters. ID queries keep about twice as many patterns (measured over seeds 0-4: 8.6-8.8
    against 4.6-4.9, AUROC 0.92-0.93 of +count; -count, the orientation before, gave 0.07-0.08)."""
    from evaluation.ood import auroc

    g = torch.Generator().manual_seed(0)
    centres = unit_centres(g, 10, 32)
    memory, id_q = clustered(g, centres, 2000), clustered(g, centres, 500)
    ood_q = clustered(g, unit_centres(g, 10, 32), 500)
    s_in = ood_scores.hopfield_scores(id_q, memory)["hopfield_retrieved"]
    s_out = ood_scores.hopfield_scores(ood_q, memory)["hopfield_retrieved"]
    assert s_in.mean() > 1.5 * s_out.mean()
    assert auroc(s_in, s_out) > 0.8


def test_retrieval_support_orientation_holds_on_held_out_ood_kinds():
    """Checked on OOD kinds not used to choose the sign, against the same memory: queries in uniformly
    random directions (far OOD) and around the midpoints of two ID classes (near OOD, between the
    clusters). Measured over seeds 0-2: AUROC 0.91-0.93 (uniform), 0.80-0.82 (midpoints). Trained
    features are checked in docs/evaluation.md; on raw pixels, which are not clustered by class, the
    direction reverses (the score assumes class-clustered features)."""
    from evaluation.ood import auroc

    g = torch.Generator().manual_seed(0)
    centres = unit_centres(g, 10, 32)
    memory, id_q = clustered(g, centres, 2000), clustered(g, centres, 500)
    uniform = torch.randn(500, 32, generator=g)
    a, b = torch.randint(0, 10, (500,), generator=g), torch.randint(1, 10, (500,), generator=g)
    between = clustered(g, unit_centres_of(centres[a] + centres[(a + b) % 10]), 500)  # two different classes
    s_in = ood_scores.hopfield_scores(id_q, memory)["hopfield_retrieved"]
    for ood_q in (uniform, between):
        assert auroc(s_in, ood_scores.hopfield_scores(ood_q, memory)["hopfield_retrieved"]) > 0.75


def unit_centres_of(vectors):
    return vectors / vectors.norm(dim=1, keepdim=True)


def test_she_against_numpy():
    labels = RNG.integers(0, 3, size=40)
    preds = np.where(RNG.random(40) < 0.7, labels, (labels + 1) % 3)
    preds[labels == 2] = 0  # class 2 is never right: a zero pattern
    memory = {"features": torch.tensor(MEMORY), "labels": torch.tensor(labels), "preds": torch.tensor(preds),
              "num_classes": 3}
    q_preds = RNG.integers(0, 3, size=9)
    got = ood_scores.memory_scores(torch.tensor(QUERIES), torch.tensor(q_preds), memory)["she"]
    for i in range(9):
        c = q_preds[i]
        right = (labels == c) & (preds == c)
        pattern = MEMORY[right].mean(0) if right.any() else np.zeros(6)
        assert got[i] == pytest.approx(QUERIES[i] @ pattern, abs=1e-12)


def test_knn_against_numpy_and_k1_is_the_nearest_neighbour():
    q, x = np_unit(QUERIES), np_unit(MEMORY)
    dist = np.linalg.norm(q[:, None, :] - x[None, :, :], axis=2)
    np.testing.assert_allclose(ood_scores.knn_score(QUERIES, MEMORY, k=1), -dist.min(1), atol=1e-5)
    np.testing.assert_allclose(ood_scores.knn_score(QUERIES, MEMORY, k=5), -np.sort(dist, 1)[:, 4], atol=1e-5)
    np.testing.assert_allclose(ood_scores.knn_score(QUERIES, MEMORY, k=500), -dist.max(1), atol=1e-5)  # k > n: n


# ------------------------------------------------------------------------------- the stored memory
def _memory(seed=0, n=12):
    g = torch.Generator().manual_seed(seed)
    return {"features": torch.randn(n, 4, generator=g), "labels": torch.randint(0, 3, (n,), generator=g),
            "preds": torch.randint(0, 3, (n,), generator=g), "num_classes": 3}


REQUEST = {"split": "train", "size": "all", "seed": 0, "dataset": "builtin10"}


def _obtain(path, sha, request=REQUEST, seed=0):
    built, notes = [], []

    def build():
        built.append(True)
        return _memory(seed)

    memory, source = feature_memory.obtain(path, sha, request, build, write=True, say=notes.append)
    return memory, source, built, notes


def test_memory_is_stored_reused_and_rebuilt_when_stale(tmp_path):
    path = str(tmp_path / "ood_memory.safetensors")
    memory, source, built, _ = _obtain(path, "a" * 64)
    assert source == "built" and built and os.path.isfile(path)
    again, source, built, notes = _obtain(path, "a" * 64, seed=1)
    assert source == "stored" and not built and not notes
    assert torch.equal(again["features"], memory["features"]) and again["num_classes"] == 3
    # other weights: never used, rebuilt and replaced
    other, source, built, notes = _obtain(path, "b" * 64, seed=1)
    assert source == "built" and built and "other weights" in notes[0]
    assert torch.equal(other["features"], _memory(1)["features"])
    assert feature_memory.load(path, "a" * 64, REQUEST)[0] is None  # the stale one is gone
    # another request (a subsample) is rebuilt too
    _, source, _, notes = _obtain(path, "b" * 64, {**REQUEST, "size": 5})
    assert source == "built" and "another request" in notes[0]


def test_damaged_memory_is_rebuilt(tmp_path):
    path = str(tmp_path / "m.safetensors")
    _obtain(path, "a" * 64)
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF  # flip bits inside the last tensor's bytes
    open(path, "wb").write(bytes(data))
    _, source, built, notes = _obtain(path, "a" * 64)
    assert source == "built" and ("damaged" in notes[0] or "unreadable" in notes[0])
    open(path, "wb").write(b"not a safetensors file")
    assert _obtain(path, "a" * 64)[1] == "built"


def test_memory_size_and_subsample():
    assert feature_memory.parse_size("all") == "all" and feature_memory.parse_size("NONE") == "none"
    assert feature_memory.parse_size("50") == 50
    for bad in ("0", "-3", "x", "1.5"):
        with pytest.raises(UserError, match="--ood-memory"):
            feature_memory.parse_size(bad)
    a = feature_memory.sample_indices(100, 10, seed=3)
    assert len(set(a.tolist())) == 10 and list(a) == sorted(a) and a.max() < 100
    assert np.array_equal(a, feature_memory.sample_indices(100, 10, seed=3))
    assert not np.array_equal(a, feature_memory.sample_indices(100, 10, seed=4))
    assert feature_memory.sample_indices(100, "all", 3) is None and feature_memory.sample_indices(10, 50, 3) is None

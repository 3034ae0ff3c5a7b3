"""The OOD scores are declared once (evaluation/ood_table.py): what each computing function returns
is exactly its declared names, in the declared order, and every declaration says what it reads, why
higher is more in-distribution and where the score comes from."""
import torch

from evaluation import ood, ood_scores, ood_table


def test_the_computing_functions_return_the_declared_scores():
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(20, 5, generator=g), -1)
    assert tuple(ood.ood_scores(probs, sparse=True)) == ood_table.PROBABILITY_SCORES
    assert "neg_support" not in ood.ood_scores(probs, sparse=False)
    assert tuple(ood_scores.logit_scores(torch.randn(20, 5, generator=g))) == ood_table.LOGIT_SCORES
    memory = {"features": torch.randn(30, 4, generator=g), "labels": torch.arange(30) % 5,
              "preds": torch.arange(30) % 5, "num_classes": 5}
    queries = torch.randn(7, 4, generator=g)
    assert tuple(ood_scores.memory_scores(queries, torch.arange(7) % 5, memory)) == ood_table.MEMORY_SCORES


def test_every_declaration_is_complete():
    names = [s.name for s in ood_table.OOD_SCORES]
    assert len(names) == len(set(names))
    for score in ood_table.OOD_SCORES:
        assert score.reads in (ood_table.PROBABILITIES, ood_table.LOGITS, ood_table.MEMORY)
        assert score.label and score.orientation and score.reference, score
        assert ood_table.score_label(score.name) == score.label
    assert [s.name for s in ood_table.OOD_SCORES if s.sparse_only] == ["neg_support"]
    assert ood_table.score_label("not_declared") == "not_declared"


def test_the_head_free_declarations_match_what_the_scores_read():
    """A score declared reads_head=False gives the same values whatever the head predicted (on the
    queries and on the memory); SHE, which reads the predicted class, does not."""
    g = torch.Generator().manual_seed(1)
    features, queries = torch.randn(60, 8, generator=g), torch.randn(9, 8, generator=g)
    labels = torch.arange(60) % 3

    def scores(shift):  # two heads: different predictions of the same features
        memory = {"features": features, "labels": labels, "preds": (labels + shift * (torch.arange(60) % 2)) % 3,
                  "num_classes": 3}
        return ood_scores.memory_scores(queries, (torch.arange(9) + shift) % 3, memory)

    a, b = scores(0), scores(1)
    assert ood_table.HEAD_FREE_SCORES == ood_table.HOPFIELD_SCORES + ("knn",)
    for name in ood_table.MEMORY_SCORES:
        assert (name in ood_table.HEAD_FREE_SCORES) == bool((a[name] == b[name]).all()), name
    assert all(s.reads == ood_table.MEMORY for s in ood_table.OOD_SCORES if not s.reads_head)


# ------------------------------------------------------------------ the comparison's OOD table
def _run(seed, head_shift, dataset="features", free=(0.70, 0.20), spread=0.0):
    """A synthetic eval result of one run: per-run max probability / SHE, head-free scores `free`
    (AUROC, FPR) plus `spread` for this head."""
    auroc, fpr = free
    scores = {"max_prob": {"auroc": 0.60 + 0.01 * seed + 0.02 * head_shift, "fpr_at_tpr": 0.8},
              "she": {"auroc": 0.65 + 0.03 * head_shift, "fpr_at_tpr": 0.7}}
    scores.update({n: {"auroc": auroc + spread * head_shift, "fpr_at_tpr": fpr} for n in ood_table.HEAD_FREE_SCORES})
    hist = {"edges": [0.0, 0.5, 1.0], "in": [1, 63], "out": [30, 34]}
    ood = {"dataset": dataset, "n_in": 64, "n_out": 64, "tpr": 0.95, "scores": scores,
           "histograms": {"max_prob": hist}}
    if dataset == "features":
        ood["source"] = "builtin100_ood"
    return {"seed": seed, "result": {"dataset": dataset, "ood": ood}}


def _section(variants):
    from comparison.report import ood_section

    text = "\n".join(ood_section.ood_section(variants)[0])
    return text, [line for line in text.splitlines() if line.startswith("| ")]


def _variants(**kwargs):
    free = kwargs.pop("free", lambda seed: (0.70, 0.20))
    return {head: [_run(seed, shift, free=free(seed), **kwargs) for seed in (0, 1, 2)]
            for shift, head in enumerate(("softmax", "sparsemax"))}


def test_on_cached_features_the_head_free_scores_are_shown_once():
    text, rows = _section(_variants())
    head_free = [ood_table.score_label(n) for n in ood_table.HEAD_FREE_SCORES]
    for head in ("softmax", "sparsemax"):  # the per-head table: the head's own scores only
        assert any(r.startswith(f"| {head} | max probability |") for r in rows)
        she = next(r for r in rows if r.startswith(f"| {head} | SHE |")).split("|")
        assert "p=" in she[5] or "pt" in she[5]  # SHE reads the head: its Δ vs max prob stays
        assert not any(r.startswith(f"| {head} | {label} |") for label in head_free for r in rows)
    assert "| score (every head) | AUROC | FPR@95%TPR |" in text
    for label in head_free:  # once, the one value every run gave, no interval, no p
        assert [r for r in rows if r.startswith(f"| {label} |")] == [f"| {label} | 70.00% | 20.00% |"]
    assert "the same for every head" in text and "SHE reads the head's predicted classes" in text
    assert "No Δ AUROC vs max prob" in text and "Note:" not in text
    assert "Every head and seed gave the same value" in text and "subsample" not in text


def test_a_subsampled_memory_varies_by_seed_and_says_whose_noise_that_is():
    text, rows = _section(_variants(free=lambda seed: (0.70 + 0.01 * seed, 0.20)))
    assert f"| {ood_table.score_label('knn')} | 71.00 ± 1.00% | 20.00% |" in rows
    assert "the std is the subsample's, with no training noise in it" in text
    assert "Every head and seed gave the same value" not in text


def test_heads_that_disagree_on_a_head_free_score_are_noted():
    text, rows = _section(_variants(spread=0.02))
    assert f"| {ood_table.score_label('knn')} | 71.00% | 20.00% |" in rows  # the mean of the two heads
    assert "Note: the heads' values of one seed differ by up to 2 pt" in text


def test_on_images_every_score_stays_per_head():
    text, rows = _section(_variants(dataset="builtin10"))
    assert "score (every head)" not in text
    knn = next(r for r in rows if r.startswith(f"| sparsemax | {ood_table.score_label('knn')} |")).split("|")
    assert "p=" in knn[5]  # 3 seeds: an interval and a sign-flip p

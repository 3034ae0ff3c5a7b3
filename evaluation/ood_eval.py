"""eval.py's OOD detection: the evaluated split (in-distribution) against the OOD set's val split.

Scores (all oriented higher = more in-distribution; AUROC and FPR at 95% TPR of each):
the head's probabilities (evaluation/ood.py: max probability, entropy, support size), its logits
(evaluation/ood_scores.py: energy at --ood-temperature, max logit) and, unless --ood-memory none,
the penultimate features against the run's feature memory (evaluation/ood_scores.py: minus the
modern-Hopfield energy and its sparse counterparts, retrieval support, SHE, kNN; the memory is
evaluation/feature_memory.py's, stored in the run directory and reused while valid).
"""
from __future__ import annotations

import os
import time

import torch

import data
from common.errors import UserError

from . import feature_memory, ood_report, ood_scores


def check_flags(args) -> None:
    """--ood-temperature and --ood-memory: only with --ood-dataset, then normalised in place (their
    defaults filled in); one-line UserErrors, before any evaluation runs."""
    if args.ood_dataset is None:
        for flag, value in (("--ood-temperature", args.ood_temperature), ("--ood-memory", args.ood_memory)):
            if value is not None:
                raise UserError(f"{flag} needs --ood-dataset NAME (or auto)")
        return
    args.ood_temperature = (ood_scores.DEFAULT_TEMPERATURE if args.ood_temperature is None
                            else ood_scores.check_temperature(args.ood_temperature))
    args.ood_memory = (feature_memory.DEFAULT_SIZE if args.ood_memory is None
                       else feature_memory.parse_size(args.ood_memory))


def wants_memory(ood_cfg, memory_size) -> bool:
    """Whether this evaluation computes the feature-memory scores (so the ID split keeps features)."""
    return ood_cfg is not None and memory_size != feature_memory.NONE


def build_memory(cfg, size, evaluate_split, num_classes):
    """The training split's features (all, or `size` of them drawn with the run's seed), its labels
    and the model's predictions, through eval.py's evaluation loop (eval transform, every rank)."""
    train = data.build_dataset(cfg.data, "train")
    indices = feature_memory.sample_indices(len(train), size, cfg.train.seed)
    if indices is not None:
        if not hasattr(train, "subset"):
            raise UserError(f"--ood-memory {size}: the {cfg.data.dataset} training split cannot be subsampled; "
                            f"use --ood-memory all (or none)")
        train = train.subset(indices)
    preds = evaluate_split("train", train, keep_features=True,
                           what=f"building the OOD feature memory ({len(train)} training images)")
    return {"features": preds.features.float(), "labels": preds.records["label"].long(),
            "preds": preds.records["pred"].long(), "num_classes": int(num_classes)}


def ood_results(head, cfg, ood_cfg, ood_dataset, preds, evaluate_split, *, temperature, memory_size,
                store_dir, weights_sha256, weights_kind, num_classes, is_main, say):
    """JSON-ready OOD results (ood_report.run_summary plus the logit and feature-memory scores and,
    with a memory, where it came from and what it cost)."""
    use_memory = wants_memory(ood_cfg, memory_size)
    ood_preds = evaluate_split("val", ood_dataset, data_cfg=ood_cfg, ignore_labels=True, keep_features=use_memory,
                               what=f"evaluating the OOD set {ood_cfg.dataset} ({len(ood_dataset)} images)")
    with torch.no_grad():
        probs_in, probs_out = head(preds.logits).float(), head(ood_preds.logits).float()
    extra_in = ood_scores.logit_scores(preds.logits, temperature)
    extra_out = ood_scores.logit_scores(ood_preds.logits, temperature)
    memory_info = None
    if use_memory:
        t0 = time.perf_counter()
        request = {"split": "train", "size": memory_size, "seed": cfg.train.seed, "dataset": cfg.data.dataset}
        path = feature_memory.memory_path(store_dir, weights_kind) if store_dir else None
        memory, source = feature_memory.obtain(
            path, weights_sha256, request,
            lambda: build_memory(cfg, memory_size, evaluate_split, num_classes),
            write=is_main, say=say)
        t1 = time.perf_counter()
        extra_in.update(ood_scores.memory_scores(preds.features, preds.records["pred"], memory))
        extra_out.update(ood_scores.memory_scores(ood_preds.features, ood_preds.logits.argmax(-1), memory))
        memory_info = {"n": int(memory["features"].shape[0]), "size": memory_size, "source": source,
                       "path": os.path.abspath(path) if path else None, "seconds": t1 - t0,
                       "score_seconds": time.perf_counter() - t1}
    result = ood_report.run_summary(probs_in, probs_out, head.name, ood_cfg.dataset, extra_in, extra_out)
    result["temperature"] = temperature
    result["memory"] = memory_info
    result["root"] = ood_cfg.root if data.dataset_spec(ood_cfg.dataset).files else None  # generated: no files
    if data.is_features(ood_cfg):  # name the images the OOD features came from, not just "features"
        result["source"] = data.features.read_meta(ood_cfg.root).get("dataset")
    return result

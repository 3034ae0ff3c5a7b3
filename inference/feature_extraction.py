"""The body of scripts/extract_features.py (its docstring says what it does): the source model, the
shards and the feature folder, run on the checked command line (inference/arguments.py parses it
before torch loads)."""
import copy
import json
import math
import os

import numpy as np
import torch

import data
from common.errors import UserError
from common.io import write_json
from common.runlock import writing_into
from common.seeding import mix_seed_array
from common.weights import read_safetensors_metadata, save_safetensors
from configs.loader import config_to_dict
from data import features as F
from data.classes import save_class_names
from data.loaders import TaskLoader
from evaluation import ood_report
from inference.processes import inference_accelerator
from inference.trained_run import open_from_args
from models import create_classifier
from models.pretrained import (
    CLASSIFIER_PREFIX,
    OUTPUT_HEAD_PREFIX,
    fit_pretrained,
    renamed_state_dict,
    weights_patch_grid,
)
from training.logging import progress_bar

# what must be the same for a rerun to add shards to an existing folder
SETTINGS_KEYS = ("source_sha256", *F.EXTRACTION_KEYS, "shard_size")




# ------------------------------------------------------------------------------------------ the model
def build_source_model(cfg, weights, state_dict, num_classes, say):
    """The source classifier with `state_dict` (read from the file `weights`) fitted as model.pretrained
    fits it (the backbone strictly; the classifier where its class count and kind fit); -> (model,
    source classifier tensors)."""
    grid = weights_patch_grid(state_dict)
    if grid is not None and grid[0] != cfg.data.image_size:
        say(f"{weights} was trained at {grid[0]} px ({grid[2]}x{grid[2]} patches): data.image_size set to "
            f"{grid[0]} (the config had {cfg.data.image_size}); the images are resized to it")
        cfg.data.image_size = grid[0]
    model = create_classifier(cfg.model, cfg.head, num_classes, img_size=cfg.data.image_size)
    not_loaded = fit_pretrained(model, state_dict)
    if not_loaded:
        say(f"{weights}: not loaded: {'; '.join(not_loaded)} (the classifier does not enter the features)")
    classifier = {k: v for k, (_, v) in renamed_state_dict(state_dict).items()
                  if k.startswith((CLASSIFIER_PREFIX, OUTPUT_HEAD_PREFIX))}
    return model.eval(), classifier


@torch.no_grad()
def pre_logits(model, x):
    with torch.autocast(device_type=x.device.type, enabled=False):
        return model.forward_head(model.forward_features(x.float()), pre_logits=True).float()


# ------------------------------------------------------------------------------------------ shards
def shard_tasks(lo, hi, batch_size, seeds):
    """[(indices, aug_seeds)] over positions lo..hi-1 in batches (seeds None: eval transform)."""
    positions = np.arange(lo, hi, dtype=np.int64)
    return [(positions[i:i + batch_size], None if seeds is None else seeds[i:i + batch_size])
            for i in range(0, len(positions), batch_size)]


def compute_shard(model, dataset, data_cfg, lo, hi, *, views, augment, seed, device):
    """The rows of positions lo..hi-1 for every view: features, labels, index, view."""
    feats, labels, index, view_ids = [], [], [], []
    for v in range(views):
        seeds = mix_seed_array(seed, "features", v, last=np.arange(lo, hi, dtype=np.int64)) if augment else None
        tasks = shard_tasks(lo, hi, data_cfg.eval_batch_size, seeds)
        got = 0
        for x, y in TaskLoader(dataset, data_cfg, tasks, augment=augment, device=device):
            feats.append(pre_logits(model, x).cpu())
            labels.append(y.cpu())
            got += len(y)
        if got != hi - lo:
            raise UserError(f"{hi - lo - got} image(s) at positions {lo}..{hi - 1} were undecodable "
                            f"(data.skip_corrupt): cached features need every image; fix or remove them")
        index.append(torch.arange(lo, hi, dtype=torch.int64))
        view_ids.append(torch.full((hi - lo,), v, dtype=torch.int64))
    return {"features": torch.cat(feats), "labels": torch.cat(labels).long(), "index": torch.cat(index),
            "view": torch.cat(view_ids)}


def shard_is_complete(path, sha256):
    """A shard file is written atomically, so one that exists is complete; one written from other
    weights is refused (mixing two sources)."""
    if not os.path.isfile(path):
        return False
    try:
        meta = read_safetensors_metadata(path)
    except Exception as err:  # safetensors raises its own error types for a damaged header
        raise UserError(f"{path} is unreadable ({err}); delete it and rerun (the other shards are kept)") from None
    if meta.get("source_sha256") != sha256:
        raise UserError(f"{path} holds features of other weights (sha256 {meta.get('source_sha256', '?')[:12]}...); "
                        f"extract into a new --output folder")
    return True


def extract_split(model, dataset, data_cfg, out_dir, split, *, views, augment, seed, shard_size, sha256,
                  accelerator):
    """This rank's shards of one split (i % world == rank); -> shards written now."""
    n = len(dataset)
    shards = [i for i in range(math.ceil(n / shard_size)) if i % accelerator.num_processes == accelerator.process_index]
    written = 0
    bar = progress_bar(len(shards), enabled=accelerator.is_main_process, unit="shard")
    bar.set_description(f"{split} ({n} images, {views} view{'s' if views > 1 else ''})")
    try:
        for i in shards:
            path = F.shard_path(out_dir, split, i)
            if not shard_is_complete(path, sha256):
                lo, hi = i * shard_size, min(n, (i + 1) * shard_size)
                rows = compute_shard(model, dataset, data_cfg, lo, hi, views=views, augment=augment, seed=seed,
                                     device=accelerator.device)
                save_safetensors(rows, path, metadata={"source_sha256": sha256, "split": split, "shard": str(i),
                                                       "views": str(views), "shard_size": str(shard_size)})
                written += 1
            bar.update(1)
    finally:
        bar.close()
    return written


# ------------------------------------------------------------------------------------------ a folder
def folder_meta(cfg, source, dim, classes, *, views, augment, shard_size, splits, counts, complete, ood=None):
    return {"format": F.FORMAT_VERSION, "complete": complete, "source": source, "source_sha256": source["sha256"],
            "feature_dim": dim, "num_classes": len(classes), "classes": list(classes), "dataset": cfg.data.dataset,
            "splits": list(splits), "counts": counts, "views": views, "augment": augment, "shard_size": shard_size,
            "seed": cfg.train.seed, "ood": ood, "config": config_to_dict(cfg)}


def check_same_settings(out_dir, meta):
    """A rerun may add shards to a folder only when it was started with the same settings."""
    path = os.path.join(out_dir, F.META_FILE)
    if not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            old = json.load(f)
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is unreadable ({err}); extract into a new --output folder") from None
    for key in SETTINGS_KEYS:
        if old.get(key) != json.loads(json.dumps(meta.get(key))):
            raise UserError(f"{out_dir} holds features extracted with other settings ({key} differs); extract into "
                            f"a new --output folder")


def extract_folder(model, cfg, out_dir, splits, *, views, augment, shard_size, source, classifier, accelerator,
                   say, ood=None):
    """Every split of one feature folder (train views only for the train split), then features.json."""
    classes = data.class_names(cfg.data)
    dim = int(model.num_features)
    datasets = {s: data.build_dataset(cfg.data, s) for s in splits}
    counts = {s: len(ds) for s, ds in datasets.items()}
    view_of = {s: (views if (augment and s == "train") else 1) for s in splits}
    args = dict(views=views, augment=augment, shard_size=shard_size, splits=splits, ood=ood)
    main = accelerator.is_main_process
    # every rank checks (a cheap read), so a refusal stops every rank rather than leave the others waiting
    check_same_settings(out_dir, folder_meta(cfg, source, dim, classes, counts=counts, complete=False, **args))
    written = 0
    for split in splits:
        written += extract_split(model, datasets[split], cfg.data, out_dir, split, views=view_of[split],
                                 augment=augment and split == "train", seed=cfg.train.seed, shard_size=shard_size,
                                 sha256=source["sha256"], accelerator=accelerator)
    accelerator.wait_for_everyone()
    if main:
        save_class_names(out_dir, classes)
        if classifier:
            save_safetensors(classifier, os.path.join(out_dir, F.CLASSIFIER_FILE))
        write_json(folder_meta(cfg, source, dim, classes, counts=counts, complete=True, **args),
                   os.path.join(out_dir, F.META_FILE))
        say(f"{out_dir}: {', '.join(f'{s} {n}' for s, n in counts.items())} image(s), {dim}-dim features "
            f"({written} shard(s) written now, the others were complete)")
    return counts


def default_splits(cfg):
    return ["train", "val"] + (["calib"] if cfg.data.calib_fraction > 0 else [])


def ood_config(cfg, args):
    """The config of the OOD set's extraction (None without --ood)."""
    if args.ood is None:
        if args.ood_root:
            raise UserError("--ood-root needs --ood NAME")
        return None
    name = ood_report.resolve_ood_dataset(args.ood, cfg.data.dataset, flag="--ood")
    ood = copy.deepcopy(cfg)
    ood.data.dataset = name
    if args.ood_root:
        ood.data.root = args.ood_root
    ood.data.calib_fraction = 0.0
    return ood


def extract(args):
    """The extraction of parsed and checked arguments (scripts/extract_features.py main); -> exit status."""
    out = args.output
    run = open_from_args(args)
    cfg, weights, kind = run.cfg, run.weights, run.weights_kind
    if data.is_features(cfg.data):
        raise UserError(f"{args.checkpoint} was trained on cached features (data.dataset=features): extract from "
                        f"the run or weights of the image model")
    splits = list(dict.fromkeys(args.splits or default_splits(cfg)))
    ood_cfg = ood_config(cfg, args)
    accelerator = inference_accelerator("scripts/extract_features.py")
    main_proc = accelerator.is_main_process

    def say(msg):
        if main_proc:
            print(msg, flush=True)

    # the hash of the very bytes the model is built from, checked against the run's record of them
    state_dict, sha256 = run.read_weights()
    model, classifier = build_source_model(cfg, weights, state_dict, data.num_classes(cfg.data), say)
    if ood_cfg is not None:
        ood_cfg.data.image_size = cfg.data.image_size
    model.to(accelerator.device)
    source = {"path": args.checkpoint, "file": weights, "weights": kind, "sha256": sha256}
    # one writer per folder; the temporary shards and files of a killed extraction go first
    subfolders = splits + ([F.OOD_SUBDIR, os.path.join(F.OOD_SUBDIR, "val")] if ood_cfg is not None else [])
    with writing_into(out, purpose="feature extraction", subfolders=subfolders, enabled=main_proc):
        extract_folder(model, cfg, out, splits, views=args.views, augment=args.augment, shard_size=args.shard_size,
                       source=source, classifier=classifier, accelerator=accelerator, say=say,
                       ood=ood_cfg.data.dataset if ood_cfg is not None else None)
        if ood_cfg is not None:
            extract_folder(model, ood_cfg, os.path.join(out, F.OOD_SUBDIR), ["val"], views=1, augment=False,
                           shard_size=args.shard_size, source=source, classifier={}, accelerator=accelerator, say=say)
    accelerator.end_training()
    return 0

"""Predict the classes of new images with a trained run (the command `predict.py`, whose docstring is
the user's description)."""
import csv
import io
import json
import os
import sys
import time

import torch
from accelerate.utils import gather_object
from torch.utils.data import DataLoader

import data
from common import rundir
from common.errors import UserError
from common.io import atomic_write_text, json_text
from common.runlock import writing_into
from common.seeding import mix_seed
from data.classes import check_class_names, class_list_problem
from data.samplers import eval_batches
from data.unlabeled import ImageBatches
from evaluation import conformal
from evaluation.calibration_file import conformal_path, load_thresholds
from evaluation.gather import gather_chunks
from inference.processes import inference_accelerator
from inference.trained_run import open_from_args
from models.heads import SPARSE_HEAD_NAMES
from training.logging import console, progress_bar

LIST_SEP = ";"  # between class names inside one CSV cell (JSONL has real lists)
PROB_DIGITS = 6  # significant digits of a listed probability (float32 holds about 7)


# ============================================================================ model and classes
def read_class_file(path):
    """Class names from a classes.json ({"classes": [...]} or a list) or a text file (one per line)."""
    if not os.path.isfile(path):
        raise UserError(f"--classes {path}: no such file")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.lower().endswith(".json"):
        try:
            loaded = json.loads(text)
            names = loaded["classes"] if isinstance(loaded, dict) else loaded
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ValueError("not a list of names")
        except (ValueError, KeyError, TypeError) as err:
            raise UserError(f"--classes {path} is not a classes.json ({err}); "
                            f"expected {{\"classes\": [...]}}") from None
    else:
        names = [line.strip() for line in text.splitlines() if line.strip()]
    problem = class_list_problem(names)  # the check a run's own classes.json gets (data/classes.py)
    if problem:
        raise UserError(f"--classes {path} {problem}")
    return names


def class_names_for(args, run):
    """-> (names, where they came from): --classes, the run's classes.json, or the config's dataset."""
    run_names = run.run_classes()
    if args.classes:
        names = read_class_file(args.classes)
        if run_names is not None:
            check_class_names(run_names, names, run_dir=run.run_dir)
        return names, args.classes
    if run_names is not None:
        return run_names, os.path.join(run.run_dir, rundir.CLASSES)
    try:
        return data.class_names(run.cfg.data), f"data.dataset={run.cfg.data.dataset}"
    except UserError as err:
        raise UserError(f"no class names for {args.checkpoint} ({err}); pass --classes FILE "
                        f"(a classes.json or one name per line, in label order)") from None


def load_model(run, names, source):
    """The run's model with the class list's size; a class count that differs from the weights'
    classifier is named as the classes file's fault (not as a mismatched tensor). The weights are read
    once, checked against the run's record of them (--accept-changed-weights)."""
    return run.build_model(len(names), classes_from=source,
                           fix="give the classes file the model was trained with (--classes)")


# ============================================================================ conformal thresholds
def conformal_thresholds(args, head, weights_sha256, kind, say):
    """-> (threshold rows, aps seed) eval.py calibrated for these weights; ([], None) with a note else."""
    if not os.path.isdir(args.checkpoint):
        say(f"note: {args.checkpoint} is a weights file: no conformal prediction sets (they need a run "
            f"directory that python eval.py has calibrated)")
        return [], None
    path = conformal_path(args.checkpoint, kind)
    record = load_thresholds(path)
    ema = " --ema" if kind == "ema" else ""
    if record is None:
        say(f"note: no conformal prediction sets: {path} does not exist; calibrate them with "
            f"python eval.py --checkpoint {args.checkpoint}{ema}")
        return [], None
    if record.get("head") != head.name or record.get("weights_sha256") != weights_sha256:
        say(f"warning: no conformal prediction sets: {path} was calibrated on other weights (the run trained on "
            f"since, or was replaced); recalibrate with python eval.py --checkpoint {args.checkpoint}{ema}")
        return [], None
    if record.get("warning"):
        say(f"{record['warning']} ({path})")
    return record["thresholds"], record["calibration"].get("aps_seed", 0)


def aps_uniform(aps_seed, path):
    """Randomized APS's u for one image: a pure function of (the run's APS seed, the image's path)."""
    return (mix_seed("predict-aps", int(aps_seed), path) >> 10) / float(1 << 53)


# ============================================================================ the forward pass
def forward_images(model, paths, transform, cfg, accelerator, *, batch_size, num_workers, precision):
    """-> (index (N,), logits (N, K) float32, failed [(index, reason)]) over every process, by index."""
    device = accelerator.device
    tasks = [idx for idx, _ in eval_batches(len(paths), rank=accelerator.process_index,
                                            world_size=accelerator.num_processes, batch_size=batch_size)]
    workers = min(num_workers, len(tasks))
    loader = DataLoader(ImageBatches(paths, transform, cfg.data.image_size), sampler=tasks, batch_size=None,
                        num_workers=workers, pin_memory=device.type == "cuda",
                        prefetch_factor=4 if workers > 0 else None)
    bf16 = precision == "bf16" or (precision == "auto" and device.type == "cuda")
    bar = progress_bar(sum(len(t) for t in tasks), enabled=accelerator.is_main_process, unit="img")
    indices, logits, failed = [], [], []
    with torch.no_grad():
        for batch in loader:
            if "error" in batch:
                raise UserError(batch["error"])
            failed.extend(batch["failed"])
            if batch["images"] is not None:
                with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                    out = model(batch["images"].to(device, non_blocking=True))
                indices.append(batch["index"])
                logits.append(out.float().cpu())
            bar.update(len(batch["index"]) + len(batch["failed"]))
    bar.close()
    num_classes = model.num_classes
    local_index = torch.cat(indices) if indices else torch.empty(0, dtype=torch.int64)
    local_logits = torch.cat(logits) if logits else torch.empty(0, num_classes)
    index = torch.cat(gather_chunks(local_index, accelerator))
    all_logits = torch.cat(gather_chunks(local_logits, accelerator))
    if accelerator.num_processes > 1:
        failed = [f for part in gather_object([failed]) for f in part]
    order = index.argsort()
    return index[order], all_logits[order], sorted(failed), bf16


# ============================================================================ predictions
ROW_CHUNK = 4096  # rows per set computation: bounds the float64 temporaries of the conformal code


def rounded(prob):
    """A probability at PROB_DIGITS significant digits: float32's own precision, not repr's 17."""
    return float(f"{prob:.{PROB_DIGITS}g}")


def prediction_rows(head, logits, index, paths, names, topk, thresholds, aps_seed):
    """One dict per readable image: topk, support (sparse heads), conformal sets {method: {eps: [...]}}."""
    alpha = head.alpha_value()
    sparse = head.name in SPARSE_HEAD_NAMES
    rows = []
    for start in range(0, logits.shape[0], ROW_CHUNK):
        ids = index[start:start + ROW_CHUNK]
        z, idx = logits[start:start + ROW_CHUNK], ids.tolist()
        with torch.no_grad():  # as eval.py's prediction sets compute them: the head on float32 logits,
            probs = head(z, ids=ids).float()  # a random head's noise keyed by each image's index in the list
        order = probs.double().sort(dim=1, descending=True, stable=True).indices
        masks = {}
        for t in thresholds:
            u = None
            if t["method"] == "aps":
                u = torch.tensor([aps_uniform(aps_seed, paths[i]) for i in idx], dtype=torch.float64)
            masks[(t["method"], t["epsilon"])] = conformal.set_mask(t["method"], t["threshold"], logits=z,
                                                                    probs=probs, alpha=alpha, u=u)
        masks = {key: mask.tolist() for key, mask in masks.items()}  # Python lists: fast per-row reads
        for r, (i, ranked, p) in enumerate(zip(idx, order.tolist(), probs.tolist())):
            listed = [c for c in ranked[:topk] if p[c] > 0] if sparse else ranked[:topk]  # a 0 is no candidate
            row = {"path": paths[i], "status": "ok",
                   "topk": [{"class": names[c], "prob": rounded(p[c])} for c in listed]}
            if sparse:
                row["support"] = [names[c] for c in ranked if p[c] > 0]
            if masks:
                sets = row["sets"] = {}
                for (method, eps), mask in masks.items():
                    sets.setdefault(method, {})[f"{eps:g}"] = [names[c] for c in ranked if mask[r][c]]
            rows.append(row)
    return rows


def all_rows(pred_rows, index, failed, paths):
    """Every input path in input order: predictions, and the unreadable files with their reason."""
    by_index = dict(zip(index.tolist(), pred_rows))
    for i, reason in failed:
        by_index[i] = {"path": paths[i], "status": "unreadable", "error": reason}
    return [by_index[i] for i in sorted(by_index)]


def csv_text(rows, topk, sparse, set_keys):
    header = ["path", "status"] + [f"{kind}_{k}" for k in range(1, topk + 1) for kind in ("class", "prob")]
    header += ["support"] if sparse else []
    header += [f"set_{method}_eps{eps}" for method, eps in set_keys] + ["error"]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        out = [row["path"], row["status"]]
        top = row.get("topk", [])
        for k in range(topk):
            out += [top[k]["class"], repr(top[k]["prob"])] if k < len(top) else ["", ""]
        if sparse:
            out.append(LIST_SEP.join(row.get("support", [])))
        for method, eps in set_keys:
            out.append(LIST_SEP.join(row["sets"][method][eps]) if "sets" in row else "")
        out.append(row.get("error", ""))
        writer.writerow(out)
    return buf.getvalue()


def write_predictions(rows, output, topk, sparse, thresholds):
    if output.lower().endswith(".jsonl"):
        text = "".join(json_text(row) + "\n" for row in rows)
    else:
        set_keys = [(t["method"], f"{t['epsilon']:g}") for t in thresholds]
        text = csv_text(rows, topk, sparse, set_keys)
    with writing_into(os.path.dirname(os.path.abspath(output)), purpose="predict", names=[output]):
        atomic_write_text(output, text)


# ============================================================================ main
def main(args):
    """Run the command on arguments predict.py has parsed and checked (inference/arguments.py: the flags, the
    output, the run's path and the images, args.image_paths, before torch loads); -> exit status."""
    run = open_from_args(args)
    cfg, kind = run.cfg, run.weights_kind
    transform = run.eval_transform()  # files of any size, as eval.py's pipeline transforms its split
    names, source = class_names_for(args, run)
    paths = args.image_paths
    model = load_model(run, names, source)
    head = model.output_head
    main_rank = int(os.environ.get("RANK", "0")) == 0  # notes once, not once per process (before Accelerate)
    thresholds, aps_seed = conformal_thresholds(args, head, run.weights_sha256, kind,
                                                lambda m: print(m, file=sys.stderr) if main_rank else None)

    accelerator = inference_accelerator("predict.py")  # without CUDA a gloo group of the launched processes
    model.to(accelerator.device)
    t0 = time.perf_counter()
    index, logits, failed, bf16 = forward_images(
        model, paths, transform, cfg, accelerator, precision=args.precision,
        batch_size=args.batch_size or cfg.data.eval_batch_size,
        num_workers=cfg.data.num_workers if args.num_workers is None else args.num_workers)
    forward_s = time.perf_counter() - t0
    accelerator.end_training()  # the last collective is behind every rank: the rest is the main process's
    if not accelerator.is_main_process:
        return 0
    topk = min(args.topk, len(names))
    rows = all_rows(prediction_rows(head, logits, index, paths, names, topk, thresholds, aps_seed),
                    index, failed, paths)
    write_predictions(rows, args.output, topk, head.name in SPARSE_HEAD_NAMES, thresholds)
    total_s, n_ok = time.perf_counter() - t0, len(index)
    console(f"predicted {n_ok} image(s) in {total_s:.1f} s ({n_ok / total_s:.1f} img/s; decoding and forward "
            f"alone {n_ok / forward_s:.1f} img/s; {accelerator.num_processes} process(es), "
            f"{'bf16' if bf16 else 'fp32'}); wrote {args.output}")
    if failed:
        print(f"warning: {len(failed)} unreadable file(s) skipped (first: {paths[failed[0][0]]}: {failed[0][1]}); "
              f"listed in {args.output} with status unreadable", file=sys.stderr)
    if n_ok == 0:
        raise UserError(f"none of the {len(paths)} file(s) could be read as an image (see {args.output})")
    return 0

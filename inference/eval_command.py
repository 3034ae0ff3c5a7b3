"""Evaluate a trained run (the command `eval.py`, whose docstring is the user's description)."""
import os
import sys
import time

import torch

import data
from common import rundir
from common.errors import UserError
from common.io import write_json
from common.runlock import writing_into
from data.classes import check_class_names
from evaluation import conformal, feature_memory, ood_eval, ood_report, pool_support, selective_report, tables
from evaluation import metrics as M
from evaluation.calibration_file import conformal_path, save_thresholds
from evaluation.evaluate import evaluate
from evaluation.examples import save_examples
from inference.processes import inference_accelerator
from inference.run_config import CHANGED_KEY
from inference.step_progress import step_progress
from inference.trained_run import open_from_args

NO_METRICS_FILE = "nothing written for the metrics (the table only); --output FILE.json keeps them"


def _split_half(n, seed=0):
    """Fixed random halves (calibration, evaluation) of n samples."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[: n // 2], perm[n // 2:]


def ood_data_config(cfg, args):
    """cfg.data for the OOD set of --ood-dataset/--ood-root (None when not asked); UserError if unknown."""
    ood_eval.check_flags(args)  # --ood-temperature, --ood-memory
    if args.ood_dataset is None:
        if args.ood_root:
            raise UserError("--ood-root needs --ood-dataset NAME")
        return None
    if data.is_features(cfg.data):
        return feature_ood_config(cfg, args)
    return ood_report.ood_data(cfg.data, ood_report.resolve_ood_dataset(args.ood_dataset, cfg.data.dataset),
                               args.ood_root)


def feature_ood_config(cfg, args):
    """cfg.data for the OOD features of a feature folder (FEATURE_DIR/ood, scripts/extract_features.py --ood):
    --ood-dataset auto or features; --ood-root another feature folder."""
    if args.ood_dataset not in ("auto", "features"):
        raise UserError(f"--ood-dataset {args.ood_dataset}: a probe on cached features is tested on OOD features; "
                        f"use --ood-dataset auto (FEATURE_DIR/ood, extracted with scripts/extract_features.py --ood) "
                        f"or --ood-dataset features --ood-root OTHER_FEATURE_DIR")
    root = args.ood_root or data.features.ood_root(cfg.data.root)
    if root is None:
        raise UserError(f"{cfg.data.root} holds no OOD features ({data.features.OOD_SUBDIR}/); extract them with "
                        f"scripts/extract_features.py --ood NAME, or leave out --ood-dataset")
    return ood_report.ood_data(cfg.data, cfg.data.dataset, root)  # features of the same kind, another folder


def prediction_set_results(head, cfg, args, preds, evaluate_split):
    """Calibrate on the calib split (or half of the evaluated one) and measure on the rest."""
    if args.calib == "none":
        return None
    source = args.calib
    if source == "auto":
        source = "calib" if (cfg.data.calib_fraction > 0 and args.split != "calib") else "val-half"
    note = None
    if source == "calib":
        cal_preds = evaluate_split("calib")
        cal = {"logits": cal_preds.logits, "labels": cal_preds.records["label"]}
        ev = {"logits": preds.logits, "labels": preds.records["label"]}
    else:
        if args.calib == "auto":
            why = ("data.calib_fraction is 0" if cfg.data.calib_fraction <= 0
                   else "the calib split is the one evaluated")
            note = (f"{why}: prediction sets calibrated on a fixed random half of the {args.split} "
                    f"split, coverage measured on the other half")
        cal_idx, ev_idx = _split_half(preds.totals["n"])
        labels = preds.records["label"]
        cal = {"logits": preds.logits[cal_idx], "labels": labels[cal_idx], "ids": cal_idx}
        ev = {"logits": preds.logits[ev_idx], "labels": labels[ev_idx], "ids": ev_idx}
    with torch.no_grad():  # a random head's noise keyed by each example's index in its split, as in the records
        for part in (cal, ev):
            part["probs"] = head(part["logits"], ids=part.pop("ids", None)).float()
    alpha = head.alpha_value()
    eps = tuple(args.eps) if args.eps else conformal.EPSILONS
    for e in eps:
        if not 0 < e < 1:
            raise UserError(f"--eps values must be in (0, 1), got {e}")
    seed = conformal.aps_seed(cfg)
    methods = conformal.prediction_sets(head.name, alpha, cal, ev, epsilons=eps, aps_seed=seed)
    out = {"calibration": {"source": source, "n_calib": int(cal["labels"].numel()),
                           "n_eval": int(ev["labels"].numel()), "aps_seed": seed}, "methods": methods}
    if note:
        out["calibration"]["note"] = note
    out["warning"] = conformal.calibration_size_warning(out["calibration"]["n_calib"], eps)
    return out


def save_conformal_thresholds(ps, head, checkpoint, weights_sha256, kind):
    """RUN_DIR/conformal.json (conformal_ema.json for --ema): the calibrated thresholds predict.py
    uses for new images, tied to these weights by their sha256. Nothing for a weights file."""
    if ps is None or not os.path.isdir(checkpoint):
        return None
    path = conformal_path(checkpoint, kind)
    save_thresholds(path, prediction_sets=ps, head=head.name,
                    alpha=head.alpha_value(),
                    weights_kind=kind, weights_sha256=weights_sha256, warning=ps.get("warning"))
    return path


def selective_summary(records, head_name):
    return selective_report.run_summary({k: v.numpy() for k, v in records.items()}, head_name)


def main(args):
    """Run the command on arguments eval.py has parsed and checked (inference/arguments.py: the flags, the
    output, the run's path, before torch loads); -> exit status."""
    run = open_from_args(args)
    cfg, kind = run.cfg, run.weights_kind

    # Data and weights first: every user error surfaces before any process group is set up.
    if args.calib == "calib" and cfg.data.calib_fraction <= 0:
        raise UserError("--calib calib needs a run trained with data.calib_fraction > 0 "
                        "(this one held no calibration data out); use --calib val-half or auto")
    ood_cfg = ood_data_config(cfg, args)
    num_classes = data.num_classes(cfg.data)
    dataset = data.build_dataset(cfg.data, args.split)
    ood_dataset = data.build_dataset(ood_cfg, "val") if ood_cfg is not None else None
    model = run.build_model(num_classes, classes_from=f"data.dataset={cfg.data.dataset}",
                            fix="evaluate on the data the model was trained on (--dataset, --data-root)")
    if run.run_dir is not None:  # a run stores its class names: labels must mean the same classes
        check_class_names(run.run_classes(), data.class_names(cfg.data), run_dir=run.run_dir,
                          allow_mismatch=args.allow_class_mismatch, warn=lambda m: print(m, file=sys.stderr))
    head = model.output_head

    accelerator = inference_accelerator("eval.py")  # without CUDA a gloo group of the launched processes
    model.to(accelerator.device)
    evaluate_split = split_evaluator(model, cfg, accelerator)

    t0 = time.perf_counter()
    preds = evaluate_split(args.split, dataset, keep_features=ood_eval.wants_memory(ood_cfg, args.ood_memory))
    skipped = skipped_images(accelerator, dataset, preds)
    ps = prediction_set_results(head, cfg, args, preds, evaluate_split)
    ood = ood_eval.ood_results(
        head, cfg, ood_cfg, ood_dataset, preds, evaluate_split, temperature=args.ood_temperature,
        memory_size=args.ood_memory, store_dir=args.checkpoint if os.path.isdir(args.checkpoint) else None,
        weights_sha256=run.weights_sha256, weights_kind=kind, num_classes=num_classes,
        is_main=accelerator.is_main_process, say=lambda m: print(m, file=sys.stderr)) if ood_cfg is not None else None
    accelerator.end_training()  # the last collective is behind every rank: the rest is the main process's
    if not accelerator.is_main_process:
        return 0

    result = eval_result(run, args, head, preds, num_classes, accelerator.num_processes, ps, ood, skipped,
                         wall_seconds=time.perf_counter() - t0)
    warn_skipped(skipped, preds.totals["n"], args.split)
    if ps and ps.get("warning"):
        print(ps["warning"], file=sys.stderr)
    written = ood_memory_written(ood, args.checkpoint, kind)  # written before the rest, when built
    thresholds = save_conformal_thresholds(ps, head, args.checkpoint, run.weights_sha256, kind)
    if thresholds:
        written.append(wrote(thresholds, "the conformal thresholds of these weights, which predict.py uses"))
    pool_maps = None
    if preds.pooling is not None:
        result["pooling"] = pool_support.support_summary(
            preds.records[pool_support.POOL_SUPPORT_FIELD], preds.pooling["num_patches"],
            preds.pooling["heads"], preds.pooling["mapping"])
        pool_maps = pool_maps_payload(preds, cfg, model, accelerator.num_processes)
    if args.output:
        written += write_outputs(result, preds.records, args.output, pool_maps)
    if not args.quiet:
        print_result(result, cfg, kind)
    print("\n".join(written if args.output else [*written, NO_METRICS_FILE]))  # with --quiet too: files matter
    sys.stdout.flush()
    return 0


def split_evaluator(model, cfg, accelerator):
    """-> evaluate_split(split, ...): `model`'s predictions on a split, each process evaluating its shard."""
    rank, world = accelerator.process_index, accelerator.num_processes

    def evaluate_split(split, ds=None, data_cfg=None, ignore_labels=False, keep_features=False, what=None):
        """`what` names the step in its progress line (the main process's bar or, in a log, its lines)."""
        data_cfg = data_cfg or cfg.data
        ds = ds if ds is not None else data.build_dataset(data_cfg, split)
        loader = data.build_eval_loader(ds, data_cfg, rank=rank, world_size=world, device=accelerator.device)
        progress = step_progress(len(loader), what or f"evaluating the {split} split ({len(ds)} images)",
                                 enabled=accelerator.is_main_process)
        try:
            return evaluate(model, loader, accelerator, keep_examples=True, ignore_labels=ignore_labels,
                            keep_features=keep_features, progress=progress)
        finally:
            progress.close()
    return evaluate_split


def skipped_images(accelerator, dataset, preds):
    """The undecodable images data.skip_corrupt dropped, summed over the processes (each its own shard);
    RuntimeError unless the gathered predictions and the skipped images are exactly the dataset."""
    skipped = int(getattr(dataset, "skipped", 0))
    if accelerator.num_processes > 1:
        skipped = int(accelerator.reduce(torch.tensor([skipped], device=accelerator.device), reduction="sum").item())
    if preds.totals["n"] + skipped != len(dataset) or preds.logits.shape[0] + skipped != len(dataset):  # exactness
        raise RuntimeError(f"gathered {preds.totals['n']} predictions for {len(dataset)} samples ({skipped} skipped)")
    return skipped


def eval_result(run, args, head, preds, num_classes, world, ps, ood, skipped, wall_seconds):
    """The metrics eval.json holds (its pooling section, when the model pools with a support, is added after)."""
    cfg = run.cfg
    result = {
        "checkpoint": os.path.abspath(args.checkpoint), "weights": run.weights_kind, "config_name": cfg.name,
        "model": cfg.model.name, "head": head.name,
        "alpha": head.alpha_value(),
        "norm": cfg.model.norm, "dataset": cfg.data.dataset, "split": args.split, "num_processes": world,
        **M.metrics_from_records(preds.records, num_classes),
        "img_per_s": preds.img_per_s, "eval_seconds": preds.seconds, "prediction_sets": ps,
        "wall_seconds": wall_seconds,
    }
    result["skipped_images"] = skipped
    result["learn_alpha"] = head.learn_alpha  # its alpha is where training moved it (report tables show it)
    if run.changed_from_run:  # --accept-changed-model: where this model differs from the one the run trained
        result[CHANGED_KEY] = run.changed_from_run
    result["selective"] = selective_summary(preds.records, head.name)
    result["ood"] = ood
    return result


def warn_skipped(skipped, evaluated, split):
    """One line when data.skip_corrupt dropped images: how many, and what the metrics then cover."""
    if skipped and not evaluated:
        print(f"warning: every image of the {split} split ({skipped}) was undecodable and skipped "
              f"(data.skip_corrupt): no image was evaluated, the metrics are null", file=sys.stderr)
    elif skipped:
        print(f"warning: {skipped} undecodable image(s) skipped (data.skip_corrupt); metrics cover the other "
              f"{evaluated}", file=sys.stderr)


def wrote(path, what):
    """The line that names a file eval.py wrote and what it is."""
    return f"wrote {path} ({what})"


def ood_memory_written(ood, checkpoint, kind):
    """[the line of the OOD feature memory] when this evaluation built and stored it (a stored one
    reused, or one built for a weights file outside a run, is not written), else []."""
    memory = (ood or {}).get("memory")
    if not memory or memory["source"] != "built" or not memory["path"]:
        return []
    return [wrote(feature_memory.memory_path(checkpoint, kind),
                  f"the OOD feature memory of {memory['n']} training images, reused while the weights match")]


def pool_maps_payload(preds, cfg, model, world):
    """The support maps of the main process's first images (its shard's positions i are dataset
    indices i·world, rank 0), as the model saw them (un-normalised to uint8), with their weights."""
    maps = preds.pooling["maps"]
    if maps is None:
        return None
    indices = maps["positions"] * world
    return {"maps": {"images": pool_support.display_images(maps["images"], cfg.data.mean, cfg.data.std),
                     "weights": maps["weights"]},
            "grid": model.grid, "indices": indices, "labels": preds.records["label"][indices],
            "preds": preds.records["pred"][indices], "mapping": preds.pooling["mapping"],
            "patch_size": model.patch_size}


def write_outputs(result, records, output, pool_maps=None):
    """OUTPUT (JSON), STEM.csv (one flattened row), STEM.examples.safetensors (per-example records)
    and, for hopfield pooling, STEM.pool_maps.safetensors, each atomically, under the folder's lock;
    the temporary files of a killed evaluation's outputs are removed first. A failed write is one
    line naming the file (WriteError, exit 74). -> a line per file written or removed."""
    folder = os.path.dirname(os.path.abspath(output))
    maps_path = rundir.pool_maps_path(output)
    csv_path, examples_path = rundir.eval_csv_path(output), rundir.examples_path(output)
    lines = [wrote(output, "the metrics"), wrote(csv_path, "the metrics as one CSV row"),
             wrote(examples_path, "the per-example records: label, prediction, p_y, support size, loss")]
    with writing_into(folder, purpose="eval", names=rundir.eval_outputs(output) + [maps_path]):  # one writer per folder
        write_json(result, output)
        tables.write_csv([tables.flatten_metrics(result)], csv_path)
        save_examples(records, examples_path, head=result["head"], split=result["split"],
                      dataset=result["dataset"], weights=result["weights"], checkpoint=result["checkpoint"])
        if pool_maps is not None:
            pool_support.save_pool_maps(maps_path, pool_maps["maps"], grid=pool_maps["grid"],
                                        labels=pool_maps["labels"], preds=pool_maps["preds"],
                                        indices=pool_maps["indices"], mapping=pool_maps["mapping"],
                                        patch_size=pool_maps["patch_size"], split=result["split"],
                                        checkpoint=result["checkpoint"])
            lines.append(wrote(maps_path, "the pooling support maps of the first images"))
        elif os.path.isfile(maps_path) and not os.path.islink(maps_path):
            os.remove(maps_path)  # an earlier result's maps at this output, which the new one replaces
            lines.append(f"removed {maps_path} (an earlier result's pooling maps; this one has none)")
    return lines


def print_result(result, cfg, kind):
    world = result["num_processes"]
    print(f"{cfg.name}: {cfg.model.name} + {result['head']} head, {kind} weights, "
          f"{cfg.data.dataset} {result['split']} ({world} process{'es' if world > 1 else ''})")
    print(tables.eval_table(result))
    if result.get("pooling"):
        print(pool_support.describe(result["pooling"]))
    if result.get("ood"):
        print(tables.ood_table(result["ood"]))
    ps = result["prediction_sets"]
    if ps and ps["calibration"].get("note"):
        print(f"note: {ps['calibration']['note']}")

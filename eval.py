"""Evaluate a checkpoint: accuracy, calibration, sparsity and conformal prediction sets.

    python eval.py --checkpoint runs/quickstart                      # a train.py run directory
    python eval.py --checkpoint runs/quickstart --ema --output m.json
    python eval.py --checkpoint runs/quickstart/checkpoints/step_000000780   # one checkpoint of a run
    python eval.py --checkpoint resmlp_12_no_dist.pth --model resmlp_s12 \\
        --dataset imagefolder --data-root datasets/imagenet          # timm / FB ImageNet weights
    accelerate launch --multi_gpu --num_processes 2 eval.py --checkpoint runs/quickstart

A run directory gives the resolved config (config.yaml) and weights (model.safetensors, or
model_ema.safetensors with --ema); a checkpoint directory of a run (RUN/checkpoints/step_N) gives
its weights (ema.safetensors with --ema) and the config that trained it; a weights file (.safetensors/.pth, this project's, timm's or the
original FB/DeiT ResMLP format) needs --config or --model/--dataset to say what to build.
Extra `key.sub=value` arguments (or `--data.root X`) override the config, as for train.py.

Metrics (evaluation/metrics.py, through evaluation/evaluate.py, the loop train.py's periodic eval
uses too; float32, autocast off): top-1/5, the head's Fenchel-Young loss, NLL where finite and the
fraction of samples with p_y = 0, ECE (15 bins) with reliability-diagram data, support size
(mean/median/histogram), support coverage of the true class, per-class accuracy, inference img/s.
Prediction sets (evaluation/conformal.py, Campos et al., AISTATS 2025): calibrated on the run's
held-out calibration split (data.calib_fraction > 0) or, when the run held none out, on a fixed
random half of the evaluated split (reported on the other half). Sample counts are exact across
processes. APS's random tie-breaking is seeded per run (its training seed and head).
Selective prediction (evaluation/selective_report.py): risk-coverage AURC, E-AURC and the risk at
fixed coverages, with confidence = max probability and, for sparse heads, also 1/support size.
Hopfield pooling (model.pool=hopfield): the pooling support, how many of the N patches each image's
feature uses (weight > 0; evaluation/pool_support.py, from the same forward pass): mean, median and
histogram in the JSON's "pooling", per image in the records (`pool_support`), and the first images'
support maps in STEM.pool_maps.safetensors (drawn by the comparison report). Average pooling: none.
Out-of-distribution detection (--ood-dataset NAME, any dataset this project loads, or `auto`: the
built-in data's own OOD set, builtin10_ood for builtin10): AUROC and FPR at 95% TPR of max
probability, entropy and (sparse heads) support size, the evaluated split being in-distribution
(evaluation/ood_report.py). Writes JSON (--output), a CSV row and the per-example records
(evaluation/examples.py: label, pred, p_y, max prob, support size, FY loss) beside it, and prints a
table.
"""
import argparse
import copy
import os
import sys
import time

import torch
from accelerate import Accelerator

import configs
import data
import models
from common import rundir
from common.errors import UserError
from common.io import prepare_output, write_json
from common.seeding import mix_seed
from common.weights import load_into, read_state_dict
from configs.loader import apply_overrides, config_to_dict
from data.classes import check_class_names, load_class_names
from engine import checkpoint as ck
from engine import resume_policy as rp
from engine.cli import run_cli
from engine.feature_probe import build_eval_probe
from engine.runlock import writing_into
from evaluation import conformal, ood_report, pool_support, report, selective_report
from evaluation import metrics as M
from evaluation.evaluate import evaluate
from evaluation.examples import save_examples
from models.convert import convert_state_dict
from models.pretrained import weights_patch_grid
from models.resmlp import VARIANTS

RAW_WEIGHTS = rundir.WEIGHTS
EMA_WEIGHTS = rundir.EMA_WEIGHTS
CALIB_SOURCES = ("auto", "calib", "val-half", "none")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, metavar="RUN_DIR_OR_WEIGHTS",
                   help="train.py run directory, one of its checkpoints (RUN/checkpoints/step_N), or a "
                        ".safetensors/.pth weights file")
    p.add_argument("--config", help="YAML config (needed for a weights file unless --model is given; "
                                    "replaces a run directory's config.yaml)")
    p.add_argument("--model", help="model name for a weights file without --config (e.g. resmlp_s12)")
    p.add_argument("--head", help="output head for a weights file without --config (default softmax)")
    p.add_argument("--img-size", type=int, help="model/data image size (default: the model variant's own, "
                                                "32 for the CIFAR-size models, 224 otherwise)")
    p.add_argument("--dataset", help="override data.dataset")
    p.add_argument("--data-root", help="override data.root")
    p.add_argument("--split", default="val", choices=("val", "calib", "train"))
    p.add_argument("--ema", action="store_true", help="evaluate the run's EMA weights")
    p.add_argument("--batch-size", type=int, help="per-process eval batch size (data.eval_batch_size)")
    p.add_argument("--calib", default="auto", choices=CALIB_SOURCES,
                   help="prediction-set calibration data: auto = the calib split when the run held one "
                        "out (data.calib_fraction > 0), else half of the evaluated split; none = skip")
    p.add_argument("--eps", type=float, nargs="+", default=None, help="miscoverage levels (default 0.1 0.05)")
    p.add_argument("--ood-dataset", metavar="NAME", default=None,
                   help="out-of-distribution set for OOD detection (a data.dataset name, e.g. builtin10_ood, "
                        "imagefolder with --ood-root; auto = the built-in data's own OOD set)")
    p.add_argument("--ood-root", metavar="DIR", default=None,
                   help="data root of the OOD set (default: the run's data.root)")
    p.add_argument("--output", help="metrics JSON path (a CSV row and STEM.examples.safetensors are "
                                    "written beside it)")
    p.add_argument("--quiet", action="store_true", help="no table on the terminal")
    p.add_argument("--allow-class-mismatch", action="store_true",
                   help="evaluate although the dataset's class names differ from the run's classes.json")
    args, rest = p.parse_known_args(argv)
    args.overrides = _collect_overrides(rest, p)
    return args


def _collect_overrides(rest, parser):
    """`key.sub=value` and `--key.sub value` / `--key.sub=value` -> ['key.sub=value', ...]."""
    out, i = [], 0
    while i < len(rest):
        item = rest[i]
        if item.startswith("--") and "." in item.split("=", 1)[0]:
            if "=" in item:
                out.append(item[2:])
            elif i + 1 < len(rest):
                out.append(f"{item[2:]}={rest[i + 1]}")
                i += 1
            else:
                raise UserError(f"{item} needs a value (e.g. {item} VALUE)")
        elif not item.startswith("-") and "=" in item:
            out.append(item)
        else:
            raise UserError(f"unrecognized argument '{item}'; see python eval.py --help")
        i += 1
    return out


def _flag_overrides(args, default_img_size=None):
    out = []
    if args.model:
        out.append(f"model.name={args.model}")
    if args.head:
        out.append(f"head.name={args.head}")
    img = args.img_size or default_img_size
    if img:
        out.append(f"data.image_size={img}")
    if args.dataset:
        out.append(f"data.dataset={args.dataset}")
    if args.data_root:
        out.append(f"data.root={args.data_root}")
    if args.batch_size:
        out.append(f"data.eval_batch_size={args.batch_size}")
    return out + args.overrides


def resolve(args):
    """-> (cfg, weights_path, weights_kind) from --checkpoint and the flags; UserError otherwise."""
    ckpt = args.checkpoint
    if not os.path.exists(ckpt):
        raise UserError(f"checkpoint not found: {ckpt} (give a train.py run directory or a weights file)")
    if is_checkpoint_dir(ckpt):
        return resolve_checkpoint_dir(args, ckpt)
    if os.path.isdir(ckpt):
        name = EMA_WEIGHTS if args.ema else RAW_WEIGHTS
        weights = os.path.join(ckpt, name)
        if not os.path.isfile(weights):
            if args.ema and os.path.isfile(os.path.join(ckpt, RAW_WEIGHTS)):
                raise UserError(f"{ckpt} has no {EMA_WEIGHTS} (trained with train.ema=false?); drop --ema")
            from engine.run_status import missing_weights_error
            raise missing_weights_error(ckpt, name)
        overrides = _flag_overrides(args)
        cfg = (configs.load_config(args.config, overrides) if args.config
               else configs.load_run_config(ckpt, overrides))
        return cfg, weights, "ema" if args.ema else "raw"
    if args.ema:
        raise UserError(f"--ema selects {EMA_WEIGHTS} inside a run directory; "
                        "for a weights file, pass that file itself")
    if args.config:
        return configs.load_config(args.config, _flag_overrides(args)), ckpt, "file"
    if not args.model:
        raise UserError(f"{ckpt} is a weights file: say what to build with --config CFG.yaml "
                        f"or --model NAME (e.g. --model resmlp_s12 --dataset imagefolder --data-root DIR)")
    default_img = None if args.img_size else VARIANTS.get(args.model, {}).get("img_size", 224)
    cfg = configs.config_from_dict({}, default_name=os.path.splitext(os.path.basename(ckpt))[0])
    overrides = _flag_overrides(args, default_img)
    cfg = configs.config_from_dict(apply_overrides(config_to_dict(cfg), overrides), default_name=cfg.name)
    return cfg, ckpt, "file"


def is_checkpoint_dir(path):
    """A checkpoint of a run (RUN/checkpoints/step_N) rather than the run directory itself."""
    return os.path.isfile(os.path.join(path, ck.STATE_FILE))


def run_dir_of(path):
    """The run directory of --checkpoint: itself, or the run a checkpoint directory belongs to."""
    return os.path.dirname(os.path.dirname(os.path.abspath(path))) if is_checkpoint_dir(path) else path


def resolve_checkpoint_dir(args, ckpt):
    """-> (cfg, weights, kind) for RUN/checkpoints/step_N: its weights, with the config that trained
    it (the fingerprint in its trainer_state; the run's config.yaml for older checkpoints)."""
    weights = rundir.ema_weights(ckpt) if args.ema else os.path.join(ckpt, RAW_WEIGHTS)
    if weights is None or not os.path.isfile(weights):
        why = " (trained with train.ema=false?); drop --ema" if args.ema else ""
        raise UserError(f"checkpoint {ckpt} has no {EMA_WEIGHTS if args.ema else RAW_WEIGHTS}{why}")
    overrides = _flag_overrides(args)
    saved = ck.read_trainer_state(ckpt).get("config")
    if args.config:
        cfg = configs.load_config(args.config, overrides)
    elif isinstance(saved, dict):
        cfg = configs.config_from_dict(apply_overrides(rp.fingerprint_config(saved), overrides))
    else:
        cfg = configs.load_run_config(run_dir_of(ckpt), overrides)
    return cfg, weights, "ema" if args.ema else "raw"


def build_model(cfg, weights, num_classes):
    state_dict = read_state_dict(weights)
    if data.features.is_features(cfg.data):  # a linear probe on cached features
        model = build_eval_probe(cfg, num_classes)
        load_into(model, state_dict, weights)
        return model.eval()
    grid = weights_patch_grid(state_dict)
    if grid is not None and grid[0] != cfg.model.img_size and grid[1] == VARIANTS[cfg.model.name]["patch_size"]:
        # the token-mixing layers fix the patch count: name the size, not the first mismatched tensor
        raise UserError(f"{weights} was trained at {grid[0]} px ({grid[2]}x{grid[2]} patches) but the config has "
                        f"data.image_size={cfg.model.img_size}: set data.image_size={grid[0]}")
    model = models.create_classifier(cfg.model, cfg.head, num_classes)
    # this project's, timm's or FB's format; UserError naming the first mismatched key
    load_into(model, convert_state_dict(state_dict, model), weights)
    return model.eval()


def _split_half(n, seed=0):
    """Fixed random halves (calibration, evaluation) of n samples."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[: n // 2], perm[n // 2:]


def aps_seed(cfg):
    """The seed of randomized APS's uniforms: one per run (its training seed, head and head settings,
    model norm), so seeds and heads do not all share one draw (evaluation/conformal.py)."""
    head = ",".join(f"{k}={v}" for k, v in sorted(config_to_dict(cfg)["head"].items()))
    return mix_seed("eval-aps", int(cfg.train.seed), head, str(cfg.model.norm))


def ood_data_config(cfg, args):
    """cfg.data for the OOD set of --ood-dataset/--ood-root (None when not asked); UserError if unknown."""
    if args.ood_dataset is None:
        if args.ood_root:
            raise UserError("--ood-root needs --ood-dataset NAME")
        return None
    if data.features.is_features(cfg.data):
        return feature_ood_config(cfg, args)
    name = ood_report.resolve_ood_dataset(args.ood_dataset, cfg.data.dataset)
    if name not in data.DATASET_NAMES:
        raise UserError(f"unknown --ood-dataset '{name}'; valid: auto, {', '.join(data.DATASET_NAMES)}")
    ood = copy.deepcopy(cfg.data)
    ood.dataset = name
    if args.ood_root:
        ood.root = args.ood_root
    ood.calib_fraction = 0.0  # the whole OOD val split is evaluated
    return ood


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
    ood = copy.deepcopy(cfg.data)
    ood.root, ood.calib_fraction = root, 0.0
    return ood


def ood_results(head, ood_cfg, ood_dataset, preds, evaluate_split):
    """OOD detection: the evaluated split (in-distribution) vs the OOD set's val split."""
    ood_preds = evaluate_split("val", ood_dataset, data_cfg=ood_cfg, ignore_labels=True)
    with torch.no_grad():
        probs_in, probs_out = head(preds.logits).float(), head(ood_preds.logits).float()
    result = ood_report.run_summary(probs_in, probs_out, head.name, ood_cfg.dataset)
    result["root"] = None if ood_cfg.dataset.startswith("builtin") else ood_cfg.root  # built-in: no files
    return result


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
        cal = {"logits": preds.logits[cal_idx], "labels": labels[cal_idx]}
        ev = {"logits": preds.logits[ev_idx], "labels": labels[ev_idx]}
    with torch.no_grad():
        for part in (cal, ev):
            part["probs"] = head(part["logits"]).float()
    alpha = float(head.alpha.detach()) if head.name != "softmax" else None
    eps = tuple(args.eps) if args.eps else conformal.EPSILONS
    for e in eps:
        if not 0 < e < 1:
            raise UserError(f"--eps values must be in (0, 1), got {e}")
    seed = aps_seed(cfg)
    methods = conformal.prediction_sets(head.name, alpha, cal, ev, epsilons=eps, aps_seed=seed)
    out = {"calibration": {"source": source, "n_calib": int(cal["labels"].numel()),
                           "n_eval": int(ev["labels"].numel()), "aps_seed": seed}, "methods": methods}
    if note:
        out["calibration"]["note"] = note
    out["warning"] = conformal.calibration_size_warning(out["calibration"]["n_calib"], eps)
    return out


def save_conformal_thresholds(ps, head, checkpoint, weights, kind):
    """RUN_DIR/conformal.json (conformal_ema.json for --ema): the calibrated thresholds predict.py
    uses for new images, tied to these weights by their sha256. Nothing for a weights file."""
    from engine.checkpoint import file_sha256
    from evaluation.calibration_file import conformal_path, save_thresholds

    if ps is None or not os.path.isdir(checkpoint):
        return None
    path = conformal_path(checkpoint, kind)
    save_thresholds(path, prediction_sets=ps, head=head.name,
                    alpha=float(head.alpha.detach()) if head.name != "softmax" else 1.0,
                    weights_kind=kind, weights_sha256=file_sha256(weights), warning=ps.get("warning"))
    return path


def selective_summary(records, head_name):
    return selective_report.run_summary({k: v.numpy() for k, v in records.items()}, head_name)


def main(argv=None):
    args = parse_args(argv)
    if args.output:
        prepare_output(args.output)  # a bad --output is one line now, not after the forward passes
    cfg, weights, kind = resolve(args)

    # Data and weights first: every user error surfaces before any process group is set up.
    if args.calib == "calib" and cfg.data.calib_fraction <= 0:
        raise UserError("--calib calib needs a run trained with data.calib_fraction > 0 "
                        "(this one held no calibration data out); use --calib val-half or auto")
    ood_cfg = ood_data_config(cfg, args)
    num_classes = data.num_classes(cfg.data)
    dataset = data.build_dataset(cfg.data, args.split)
    ood_dataset = data.build_dataset(ood_cfg, "val") if ood_cfg is not None else None
    model = build_model(cfg, weights, num_classes)
    if os.path.isdir(args.checkpoint):  # a run stores its class names: labels must mean the same classes
        run_dir = run_dir_of(args.checkpoint)
        check_class_names(load_class_names(run_dir), data.class_names(cfg.data), run_dir=run_dir,
                          allow_mismatch=args.allow_class_mismatch, warn=lambda m: print(m, file=sys.stderr))
    head = model.output_head

    # Without CUDA, `cpu=True` is what makes `accelerate launch --num_processes N` a gloo MULTI_CPU
    # group; otherwise every process silently runs alone on the whole split.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    rank, world = accelerator.process_index, accelerator.num_processes
    model.to(accelerator.device)

    def evaluate_split(split, ds=None, data_cfg=None, ignore_labels=False):
        data_cfg = data_cfg or cfg.data
        ds = ds if ds is not None else data.build_dataset(data_cfg, split)
        loader = data.build_eval_loader(ds, data_cfg, rank=rank, world_size=world, device=accelerator.device)
        return evaluate(model, loader, accelerator, keep_examples=True, ignore_labels=ignore_labels)

    t0 = time.perf_counter()
    preds = evaluate_split(args.split, dataset)
    # data.skip_corrupt: undecodable images are dropped (counted per process, each its own shard)
    skipped = int(accelerator.reduce(torch.tensor([getattr(dataset, "skipped", 0)], device=accelerator.device),
                                     reduction="sum").item()) if world > 1 else int(getattr(dataset, "skipped", 0))
    if preds.totals["n"] + skipped != len(dataset) or preds.logits.shape[0] + skipped != len(dataset):  # exactness
        raise RuntimeError(f"gathered {preds.totals['n']} predictions for {len(dataset)} samples ({skipped} skipped)")
    ps = prediction_set_results(head, cfg, args, preds, evaluate_split)
    ood = ood_results(head, ood_cfg, ood_dataset, preds, evaluate_split) if ood_cfg is not None else None
    if not accelerator.is_main_process:
        return 0

    result = {
        "checkpoint": os.path.abspath(args.checkpoint), "weights": kind, "config_name": cfg.name,
        "model": cfg.model.name, "head": head.name,
        "alpha": float(head.alpha.detach()) if head.name != "softmax" else 1.0,
        "norm": cfg.model.norm, "dataset": cfg.data.dataset, "split": args.split, "num_processes": world,
        **M.metrics_from_records(preds.records, num_classes),
        "img_per_s": preds.img_per_s, "eval_seconds": preds.seconds, "prediction_sets": ps,
        "wall_seconds": time.perf_counter() - t0,
    }
    result["skipped_images"] = skipped
    if skipped and not preds.totals["n"]:
        print(f"warning: every image of the {args.split} split ({skipped}) was undecodable and skipped "
              f"(data.skip_corrupt): no image was evaluated, the metrics are null", file=sys.stderr)
    elif skipped:
        print(f"warning: {skipped} undecodable image(s) skipped (data.skip_corrupt); metrics cover the other "
              f"{preds.totals['n']}", file=sys.stderr)
    if ps and ps.get("warning"):
        print(ps["warning"], file=sys.stderr)
    save_conformal_thresholds(ps, head, args.checkpoint, weights, kind)
    result["selective"] = selective_summary(preds.records, head.name)
    result["ood"] = ood
    pool_maps = None
    if preds.pooling is not None:
        result["pooling"] = pool_support.support_summary(
            preds.records[pool_support.POOL_SUPPORT_FIELD], preds.pooling["num_patches"],
            preds.pooling["heads"], preds.pooling["mapping"])
        pool_maps = pool_maps_payload(preds, cfg, model, world)
    if args.output:
        write_outputs(result, preds.records, args.output, pool_maps)
    if not args.quiet:
        print_result(result, cfg, kind, args.output)
    sys.stdout.flush()
    return 0


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
    line naming the file (WriteError, exit 74)."""
    folder = os.path.dirname(os.path.abspath(output))
    maps_path = rundir.pool_maps_path(output)
    with writing_into(folder, purpose="eval", names=rundir.eval_outputs(output) + [maps_path]):  # one writer per folder
        write_json(result, output)
        report.write_csv([report.flatten_metrics(result)], rundir.eval_csv_path(output))
        save_examples(records, rundir.examples_path(output), head=result["head"], split=result["split"],
                      dataset=result["dataset"], weights=result["weights"], checkpoint=result["checkpoint"])
        if pool_maps is not None:
            pool_support.save_pool_maps(maps_path, pool_maps["maps"], grid=pool_maps["grid"],
                                        labels=pool_maps["labels"], preds=pool_maps["preds"],
                                        indices=pool_maps["indices"], mapping=pool_maps["mapping"],
                                        patch_size=pool_maps["patch_size"], split=result["split"],
                                        checkpoint=result["checkpoint"])
        elif os.path.isfile(maps_path) and not os.path.islink(maps_path):
            os.remove(maps_path)  # an earlier result's maps at this output, which the new one replaces


def print_result(result, cfg, kind, output):
    world = result["num_processes"]
    print(f"{cfg.name}: {cfg.model.name} + {result['head']} head, {kind} weights, "
          f"{cfg.data.dataset} {result['split']} ({world} process{'es' if world > 1 else ''})")
    print(report.eval_table(result))
    if result.get("pooling"):
        print(pool_support.describe(result["pooling"]))
    if result.get("ood"):
        print(report.ood_table(result["ood"]))
    ps = result["prediction_sets"]
    if ps and ps["calibration"].get("note"):
        print(f"note: {ps['calibration']['note']}")
    if output:
        maps = f" and {rundir.pool_maps_path(output)}" if result.get("pooling") else ""
        print(f"wrote {output}, {rundir.eval_csv_path(output)}, {rundir.examples_path(output)}{maps}"
              if maps else f"wrote {output}, {rundir.eval_csv_path(output)} and {rundir.examples_path(output)}")


if __name__ == "__main__":
    run_cli(main)

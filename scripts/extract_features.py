"""Extract pre-logit features of a trained or pretrained ResMLP to safetensors shards, for head sweeps
on cached features (data.dataset=features, scripts/compare_heads.py --features DIR).

    python scripts/extract_features.py --checkpoint runs/quickstart --output features/quickstart
    python scripts/extract_features.py --checkpoint runs/quickstart --output F --ood auto --splits train val
    python scripts/extract_features.py --checkpoint resmlp_12_no_dist.pth --model resmlp_s12 \\
        --dataset imagefolder --data-root datasets/imagenet --output features/s12
    python scripts/extract_features.py --checkpoint RUN --output F --augment --views 4   # 4 augmented train views
    accelerate launch --num_processes 8 scripts/extract_features.py --checkpoint RUN --output F

--checkpoint is what eval.py takes (a run directory, one of its checkpoints, or a weights file in this
project's, timm's or the FB/DeiT format with --config or --model/--dataset); the data config is the
run's (or --config's), with key.sub=value overrides; weights that differ from the sha256 their run
recorded are refused unless --accept-changed-weights (inference/weights_record.py). The features are
`model.forward_head(model.forward_features(x), pre_logits=True)` in float32 (autocast off, eval mode).
Layout and the metadata file: data/features.py. The weights' classifier fits the data as
model.pretrained fits it (models/pretrained.py): the backbone strictly, the classifier only where its
class count fits, and classifier.safetensors keeps it, so a probe trained on these features starts
where the frozen-backbone probe on the images (model.pretrained + model.freeze=backbone) starts.

- Transform: every split through the eval transform (train augmentation off), unless --augment:
  then the train split gets --views K views per image, each through the training augmentation with a
  seed fixed by (train.seed, view, position), so an extraction is reproducible.
- Resumable by shard: shard i of a split (positions [i * S, (i + 1) * S)) is written atomically, and a
  shard file that exists is complete and is skipped; rerunning the same command finishes the rest. A
  folder extracted with other settings (another source file, views, shard size, config) is refused.
- Several processes (accelerate launch): rank r writes the shards i with i % world == r; the main
  process writes features.json once every rank is done.
- --ood NAME|auto: the OOD set's val split (auto: the built-in data's own, as eval.py --ood-dataset)
  goes to OUTPUT/ood/, a feature folder of its own; eval.py --ood-dataset auto then finds it.
"""
import importlib

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.cli import run_cli
from common.startup import say_loading
from inference import arguments  # (argparse only: a mistyped flag is answered before torch loads)


def parse_args(argv=None):
    return arguments.parse_extract_args(argv, __doc__)


def main(argv=None):
    args = parse_args(argv)
    arguments.check_extract_args(args)
    say_loading("extract_features.py")
    from inference import feature_extraction  # heavy: torch, timm and Accelerate (seconds), after the checks

    return feature_extraction.extract(args)


def __getattr__(name):  # the body's functions, as `extract_features.NAME` (loaded on first use)
    return getattr(importlib.import_module("inference.feature_extraction"), name)


if __name__ == "__main__":
    run_cli(main)

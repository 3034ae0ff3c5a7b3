"""model.pretrained: start a run from pretrained weights (training/run.py's `setup` calls
`resolve_pretrained` before anything is built, and `load_pretrained_weights` on the new model).

`resolve_pretrained` finds the weights file (a run or checkpoint directory's model.safetensors, or
the file itself), reads it once and hashes the bytes it loads (a pinned model.pretrained_sha256
must match; otherwise the hash is recorded, so config.yaml, summary.json and the resume fingerprint
name the exact weights loaded, even when the source run exports new ones meanwhile), and keeps
the weights' image size: the token-mixing layers fix the patch count, so data.image_size (and the
model's copy of it) is set to it and the data pipeline resizes the images (one line says so when the
config asked for another size). `load_pretrained_weights` fits the weights into the model
(models/pretrained.py) and prints one line with what was not loaded and why.
"""
import os
from dataclasses import dataclass

from common import rundir
from common.errors import UserError
from common.weights import read_hashed_state_dict
from models.pretrained import fit_pretrained, weights_patch_grid


@dataclass
class PretrainedWeights:
    path: str  # as configured
    file: str  # the weights file read
    sha256: str
    state_dict: dict


def weights_file(path, key):
    """The weights file behind `path`: a file, or a run/checkpoint directory's model.safetensors."""
    if os.path.isdir(path):
        file = os.path.join(path, rundir.WEIGHTS)
        if not os.path.isfile(file):
            raise UserError(f"{key}: {path} is a directory without {rundir.WEIGHTS}; give a run directory of train.py, "
                            f"a checkpoint directory or a weights file")
        return file
    if not os.path.isfile(path):
        raise UserError(f"{key}: {path} does not exist; give a run directory of train.py or a weights file "
                        f"(.safetensors, .pth)")
    return path


def hashed_weights(path, pinned, key):
    """(file, sha256, state dict) for `path`, the sha256 of the bytes the state dict was read from;
    a pinned sha256 (`{key}_sha256`) must match."""
    file = weights_file(path, key)
    state_dict, sha = read_hashed_state_dict(file)
    if pinned is not None and pinned != sha:
        raise UserError(f"{key}: {file} has sha256 {sha}, the config pins {pinned} ({key}_sha256): the file changed; "
                        f"restore it, or start a new run with {key}_sha256=null")
    return file, sha, state_dict


def resolve_pretrained(cfg, say):
    """Read and hash model.pretrained and fit the config to its image size (see the module
    docstring); -> PretrainedWeights, or None without model.pretrained. Changes `cfg` in place."""
    if cfg.model.pretrained is None:
        return None
    file, sha, state_dict = hashed_weights(cfg.model.pretrained, cfg.model.pretrained_sha256, "model.pretrained")
    cfg.model.pretrained_sha256 = sha
    grid = weights_patch_grid(state_dict)
    if grid is not None and grid[0] != cfg.data.image_size:
        size, patch, side = grid
        say(f"model.pretrained: {file} was trained at {size} px ({side}x{side} patches of {patch} px, fixed by its "
            f"token-mixing layers): data.image_size set to {size} (the config had "
            f"{cfg.data.image_size}); the data pipeline resizes the images to {size} px")
        cfg.data.image_size = size
    return PretrainedWeights(cfg.model.pretrained, file, sha, state_dict)


def load_pretrained_weights(model, weights, say):
    """Fit `weights` (PretrainedWeights) into `model`; one line with what was not loaded and why."""
    not_loaded = fit_pretrained(model, weights.state_dict)
    text = f"; not loaded: {'; '.join(not_loaded)}" if not_loaded else "; everything loaded"
    say(f"model.pretrained: {weights.file} (sha256 {weights.sha256[:12]}...){text}")
    return not_loaded


def summary_fields(cfg):
    """What summary.json records of the run's starting weights, teacher and cached features."""
    out = {}
    if cfg.data.dataset == "features":
        out["features"] = {"root": cfg.data.root, "source_sha256": cfg.data.features_source_sha256,
                           "settings_sha256": cfg.data.features_settings_sha256}
    if cfg.model.pretrained is not None:
        out["pretrained"] = {"path": cfg.model.pretrained, "sha256": cfg.model.pretrained_sha256,
                             "freeze": cfg.model.freeze}
    if cfg.train.distill != "none":
        out["teacher"] = {"path": cfg.train.teacher, "weights": cfg.train.teacher_weights,
                          "sha256": cfg.train.teacher_sha256, "distill": cfg.train.distill,
                          "alpha": cfg.train.distill_alpha, "tau": cfg.train.distill_tau}
    return out

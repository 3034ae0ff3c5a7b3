"""data.dataset=features: cached pre-logit features (scripts/extract_features.py) as a dataset.

    FEATURE_DIR/
        features.json                  what was extracted: source weights (path, sha256), feature dim,
                                       classes, rows per split, views, augment, the config used
        classes.json                   the source data's class names (data/classes.py format)
        classifier.safetensors         the source's classifier (head.*, output_head.*), so a probe
                                       trained here starts as the image-path probe does
        train/shard_00000.safetensors  `features` float32 (R, D), `labels` int64 (R,), `index` int64 (R,)
        val/..., calib/...             (the dataset positions) and `view` int64 (R,) (0 unless --views K)
        ood/                           the OOD set (--ood), itself a feature folder with a val split

Shard i of a split holds dataset positions [i * shard_size, (i + 1) * shard_size) for every view.
A split's rows load as one (N, D) tensor in dataset order, so the samplers (data/samplers.py) and
the eval batches see the same positions as the image path; with K augmented train views, epoch e
trains on view e % K (the cache's stand-in for drawing a new augmentation each epoch).

Identity: a run on a feature folder records the sha256 of the weights it was extracted from
(features.json's source_sha256: data.features_source_sha256) and of how it was extracted
(`EXTRACTION_KEYS`: data.features_settings_sha256), frozen keys of the resume fingerprint, so a
folder re-extracted at the same path is never trained or compared on as if it were the old one.

A feature dataset has no pixels: every image transform and Mixup/CutMix is refused for it
(`check_feature_config`), except the crop/flip defaults (data.hflip, data.crop_padding), which
describe the image path and are ignored here with a note (the features were extracted with the
transform features.json records).
"""
import hashlib
import json
import os

import torch

from common.errors import UserError
from common.weights import read_safetensors

META_FILE = "features.json"
CLASSIFIER_FILE = "classifier.safetensors"
OOD_SUBDIR = "ood"
FORMAT_VERSION = 1
# what a folder's features depend on besides the source weights (features.json keys); a rerun of
# the extraction adds shards only with the same ones (and the same shard size)
EXTRACTION_KEYS = ("views", "augment", "config", "dataset")
# image-only settings that must stay off (their defaults) for cached features: (key, off value)
_REFUSED = (("mixup", 0.0), ("cutmix", 0.0), ("reprob", 0.0), ("auto_augment", None), ("color_jitter", 0.0))


def shard_name(i):
    return f"shard_{i:05d}.safetensors"


def shard_path(root, split, i):
    return os.path.join(root, split, shard_name(i))


def read_meta(root):
    """features.json of a feature folder, checked; UserError (one line) for a missing folder or file,
    an unreadable file or an unfinished extraction."""
    if not os.path.isdir(root):
        raise UserError(f"data.root={root}: no such folder; data.dataset=features reads a folder written by "
                        f"scripts/extract_features.py --output DIR")
    path = os.path.join(root, META_FILE)
    if not os.path.isfile(path):
        raise UserError(f"data.root={root} has no {META_FILE}: not a feature folder (write one with "
                        f"scripts/extract_features.py --output {root})")
    try:
        with open(path) as f:
            meta = json.load(f)
        dim, classes = int(meta["feature_dim"]), list(meta["classes"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path} is unreadable ({type(err).__name__}: {err}); extract the features again") from None
    if not meta.get("complete"):
        raise UserError(f"{path}: the extraction did not finish; rerun the same scripts/extract_features.py "
                        f"command (finished shards are kept)")
    if dim < 1 or not classes:
        raise UserError(f"{path} records feature_dim={dim} and {len(classes)} classes; extract the features again")
    return meta


def identity(meta):
    """(source sha256, settings sha256) of a folder's features.json `meta` (see the module docstring)."""
    settings = json.dumps({k: meta.get(k) for k in EXTRACTION_KEYS}, sort_keys=True, separators=(",", ":"))
    return meta.get("source_sha256"), hashlib.sha256(settings.encode()).hexdigest()


def class_names(root):
    return list(read_meta(root)["classes"])


def check_feature_config(data_cfg):
    """Mixup/CutMix and pixel augmentations do not apply to cached features: one line each."""
    for key, off in _REFUSED:
        value = getattr(data_cfg, key)
        if value != off and not (off == 0.0 and value is not None and float(value) == 0.0):
            raise UserError(f"data.{key}={value} is an image augmentation; it cannot apply to cached features "
                            f"(data.dataset=features): set data.{key}={'null' if off is None else 0} (augmented "
                            f"features: scripts/extract_features.py --augment --views K)")
    if data_cfg.backend == "dali":
        raise UserError("data.backend=dali decodes images; cached features (data.dataset=features) need "
                        "data.backend=pil or auto")


def image_settings_note(data_cfg, meta):
    """One line when the config's crop/flip settings (ignored for features) are on, else None."""
    on = [f"data.{k}={getattr(data_cfg, k)}" for k in ("hflip", "crop_padding") if getattr(data_cfg, k)]
    if not on:
        return None
    how = "augmented views" if meta.get("augment") else "the eval transform"
    return (f"note: {', '.join(on)} describe the image path and do not apply to cached features (extracted "
            f"with {how}, views={meta.get('views', 1)})")


class FeatureDataset:
    """One split of cached features: `features` (K, N, D) float32 for K views (1 unless augmented),
    `labels` (N,) int64, `index` (N,) the source dataset positions. `view(epoch)` -> (N, D)."""

    def __init__(self, features, labels, index, num_classes, name="features"):
        self.views = features
        self.labels = labels
        self.index = index
        self.num_classes = num_classes
        self.name = name
        self.transform = None  # (build_dataset sets a transform on every dataset; none applies here)

    @property
    def features(self):
        return self.views[0]

    @property
    def num_features(self):
        return int(self.views.shape[-1])

    def view(self, epoch):
        return self.views[epoch % self.views.shape[0]]

    def subset(self, positions):
        """The rows at `positions` (every view), e.g. the tune split's hold-out of train."""
        idx = torch.as_tensor(positions, dtype=torch.int64)
        return FeatureDataset(self.views[:, idx], self.labels[idx], self.index[idx], self.num_classes, self.name)

    def __len__(self):
        return int(self.labels.numel())

    def __getitem__(self, i):
        return self.views[0][i], int(self.labels[i])


def _split_shards(root, split):
    folder = os.path.join(root, split)
    if not os.path.isdir(folder):
        raise UserError(f"{root} has no {split}/ features; extract it with scripts/extract_features.py "
                        f"--splits {split}")
    names = sorted(n for n in os.listdir(folder) if n.startswith("shard_") and n.endswith(".safetensors"))
    if not names:
        raise UserError(f"{folder} holds no shard_*.safetensors; extract the features again")
    return [os.path.join(folder, n) for n in names]


def load_split(root, split, meta=None):
    """-> FeatureDataset of ROOT/SPLIT (UserError: missing split, wrong dim, rows that do not add up)."""
    meta = meta or read_meta(root)
    dim, k = int(meta["feature_dim"]), len(meta["classes"])
    feats, labels, index, views = [], [], [], []
    for path in _split_shards(root, split):
        t = read_safetensors(path)
        missing = [key for key in ("features", "labels", "index", "view") if key not in t]
        if missing:
            raise UserError(f"{path} lacks '{missing[0]}'; extract the features again")
        if t["features"].ndim != 2 or t["features"].shape[1] != dim:
            raise UserError(f"{path} holds features of shape {tuple(t['features'].shape)}, {META_FILE} says "
                            f"dimension {dim}: shards of another extraction are mixed in; extract into a new folder")
        feats.append(t["features"].float())
        labels.append(t["labels"].long())
        index.append(t["index"].long())
        views.append(t["view"].long())
    feats, labels, index, views = (torch.cat(x) for x in (feats, labels, index, views))
    num_views = int(views.max()) + 1
    expected = (meta.get("counts") or {}).get(split)
    per_view = []
    for v in range(num_views):
        rows = torch.nonzero(views == v).flatten()
        order = rows[torch.argsort(index[rows], stable=True)]
        per_view.append(order)
    n = int(per_view[0].numel())
    first = index[per_view[0]]
    if any(o.numel() != n or not torch.equal(index[o], first) for o in per_view) or \
            not torch.equal(first, torch.arange(n)) or (expected is not None and int(expected) != n):
        raise UserError(f"{os.path.join(root, split)}: its shards do not hold every position 0..N-1 once per view "
                        f"({n} rows in view 0, {META_FILE} counts {expected}); extract the features again")
    y = labels[per_view[0]]
    if n and (int(y.min()) < 0 or int(y.max()) >= k):
        raise UserError(f"{os.path.join(root, split)}: labels outside 0..{k - 1}; extract the features again")
    stacked = torch.stack([feats[o] for o in per_view])
    return FeatureDataset(stacked, y, first, k, name=f"features:{meta.get('dataset', '?')}")


def build_split(data_cfg, split):
    """The FeatureDataset data.build_dataset returns for data.dataset=features."""
    check_feature_config(data_cfg)
    meta = read_meta(data_cfg.root)
    if split not in (meta.get("counts") or {}):
        have = ", ".join(meta.get("counts") or {}) or "none"
        hint = " (data.calib_fraction > 0 at extraction)" if split == "calib" else ""
        raise UserError(f"{data_cfg.root} has no {split} features (extracted: {have}); extract it with "
                        f"scripts/extract_features.py --splits ... {split}{hint}")
    ds = load_split(data_cfg.root, split, meta)
    if len(ds) == 0:
        raise UserError(f"the {split} split of {data_cfg.root} is empty")
    return ds


def ood_root(root):
    """The OOD feature folder of a feature folder, or None when none was extracted."""
    path = os.path.join(root, OOD_SUBDIR)
    return path if os.path.isfile(os.path.join(path, META_FILE)) else None


def read_classifier(root):
    """The source's classifier tensors (head.*, output_head.*), or {} when the folder stores none."""
    path = os.path.join(root, CLASSIFIER_FILE)
    return read_safetensors(path) if os.path.isfile(path) else {}

"""data.dataset=features in train.py and eval.py: the run's config fitted to the feature folder, and
the linear probe (models/linear_probe.py) that trains on it.

`resolve_features` (training/run.py's setup, before the resume fingerprint): reads FEATURE_DIR/features.json,
records the folder's identity (data.features_source_sha256 and features_settings_sha256: frozen
resume keys, in config.yaml and summary.json; a pinned one must match),
refuses what cannot apply (model.pretrained, model.freeze=backbone: the backbone ran already, at
extraction; train.distill: a teacher needs the images; Mixup/CutMix and pixel augmentations:
data/features.py) and sets the model keys that decide the classifier's initial weights (model.name,
norm, init_values, pool..., data.image_size) and data.calib_fraction to the source's, one line
naming any the config had otherwise, so config.yaml says which architecture's features the probe reads.

`build_feature_probe` (training/run.py, under reseed(seed, "init") as for every model): the image path's
classifier, initialised with the same draws, fitted to the source classifier the same way
(models/linear_probe.py explains why); `build_eval_probe` (eval.py): a probe of the folder's
dimension for a trained probe's weights.
"""
from common.errors import UserError
from data import features as feature_data
from data.registry import is_features
from models import create_classifier
from models.linear_probe import create_linear_probe

# the source model's keys the probe's initial weights depend on (the image path builds the whole
# model under the "init" RNG stream before its classifier), copied from features.json's config
SOURCE_MODEL_KEYS = ("name", "norm", "init_values", "pool", "pool_mapping", "pool_beta", "pool_k")


def resolve_features(cfg, say):
    """-> features.json (dict) for data.dataset=features, else None; changes `cfg` in place."""
    if not is_features(cfg.data):
        return None
    root = cfg.data.root
    if cfg.model.pretrained is not None:
        raise UserError(f"model.pretrained does not apply to data.dataset=features: the features in {root} were "
                        f"extracted from their source already; set model.pretrained=null")
    if cfg.model.freeze != "none":
        raise UserError("model.freeze=backbone does not apply to data.dataset=features: the probe has no backbone "
                        "(it trains the classifier only); set model.freeze=none")
    if cfg.train.distill != "none":
        raise UserError(f"train.distill={cfg.train.distill} does not apply to data.dataset=features: the teacher "
                        f"needs the images; distil on the image path, or set train.distill=none")
    feature_data.check_feature_config(cfg.data)
    meta = feature_data.read_meta(root)
    record_identity(cfg, meta)
    source = meta.get("config") or {}
    changed = []
    for key in SOURCE_MODEL_KEYS:
        if key in source.get("model", {}) and getattr(cfg.model, key) != source["model"][key]:
            changed.append(f"model.{key}={source['model'][key]} (the config had {getattr(cfg.model, key)})")
            setattr(cfg.model, key, source["model"][key])
    size = source.get("data", {}).get("image_size")
    if size is not None and cfg.data.image_size != size:
        changed.append(f"data.image_size={size} (the config had {cfg.data.image_size})")
        cfg.data.image_size = size
    calib = float(source.get("data", {}).get("calib_fraction", 0.0)) if "calib" in meta["counts"] else 0.0
    if cfg.data.calib_fraction != calib:
        changed.append(f"data.calib_fraction={calib:g} (the config had {cfg.data.calib_fraction:g})")
        cfg.data.calib_fraction = calib
    if changed:
        say(f"data.dataset=features: set from {root}/{feature_data.META_FILE} (the source the features were "
            f"extracted with): {', '.join(changed)}")
    note = feature_data.image_settings_note(cfg.data, meta)
    if note:
        say(note)
    return meta


_IDENTITY_KEYS = (("features_source_sha256", "from other weights"), ("features_settings_sha256", "with other settings"))


def record_identity(cfg, meta):
    """data.features_source_sha256 / features_settings_sha256 := the folder's (data/features.py
    `identity`); a pinned one must match (UserError, one line)."""
    for (key, how), have in zip(_IDENTITY_KEYS, feature_data.identity(meta)):
        pinned = getattr(cfg.data, key)
        if pinned is not None and pinned != have:
            raise UserError(f"data.{key}: the features in {cfg.data.root} were extracted {how} than the config "
                            f"pins (sha256 {have}, pinned {pinned}); restore those features, or start a new run "
                            f"with data.{key}=null")
        setattr(cfg.data, key, have)


def build_feature_probe(cfg, num_classes, meta, say):
    """The probe of a features run, initialised as the image-path probe is (see the module docstring)."""
    # the image path's draws from the init stream
    like = create_classifier(cfg.model, cfg.head, num_classes, img_size=cfg.data.image_size)
    probe, not_loaded = create_linear_probe(int(meta["feature_dim"]), num_classes, cfg.head, like=like,
                                            source_classifier=feature_data.read_classifier(cfg.data.root))
    text = f"; not loaded: {'; '.join(not_loaded)}" if not_loaded else "; the source's classifier loaded"
    say(f"data.dataset=features: a linear {cfg.head.name} probe on {meta['feature_dim']}-dim features of "
        f"{meta.get('source', {}).get('path', '?')}{text}")
    return probe


def build_eval_probe(cfg, num_classes):
    """A probe of the feature folder's dimension, for eval.py to load trained weights into; features
    of other weights than the probe was trained on (data.features_source_sha256) are refused."""
    meta = feature_data.read_meta(cfg.data.root)
    trained_on, here = cfg.data.features_source_sha256, meta.get("source_sha256")
    if trained_on is not None and trained_on != here:
        raise UserError(f"the features in data.root={cfg.data.root} were extracted from other weights (sha256 "
                        f"{str(here)[:12]}…) than the probe was trained on ({trained_on[:12]}…); evaluate it on "
                        f"features of its own source, or extract them again from it")
    probe, _ = create_linear_probe(int(meta["feature_dim"]), num_classes, cfg.head)
    return probe

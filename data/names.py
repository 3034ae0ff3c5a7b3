"""The data vocabularies the config schema and the data code share: requested splits, decoding
backends and the training crop recipes (data/transforms.py builds each recipe; a dataset's
declaration in data/registry.py names the one data.train_crop=auto means for it)."""
SPLITS = ("train", "val", "calib", "tune")
BACKENDS = ("pil", "dali", "auto")
CROP_RECIPES = ("pad", "rrc")

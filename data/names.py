"""The one list of dataset names, data backends and splits (configs/schema.py and the dataset builders import it)."""
DATASET_NAMES = ("builtin10", "builtin100", "builtin10_ood", "builtin100_ood", "cifar10", "cifar100", "imagefolder", "shards", "features")
SPLITS = ("train", "val", "calib", "tune")
BACKENDS = ("pil", "dali", "auto")

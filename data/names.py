"""The data vocabularies the config schema, the dataset declarations and the data code share,
importable without torch (the config loader checks a command line before torch loads): requested
splits, decoding backends, the training crop recipes (data/transforms.py builds each recipe; a
dataset's declaration in data/registry.py names the one data.train_crop=auto means for it), the
resize interpolations, the far-OOD generators (data/far_ood.py) and the CIFAR archives' layout
(data/cifar.py reads them)."""
SPLITS = ("train", "val", "calib", "tune")
BACKENDS = ("pil", "dali", "auto")
CROP_RECIPES = ("pad", "rrc")
TRAIN_CROPS = ("auto",) + CROP_RECIPES
INTERPOLATIONS = ("bicubic", "bilinear", "nearest", "random")
FAR_OOD_KINDS = ("noise", "blobs")

CIFAR = {
    "cifar10": dict(title="CIFAR-10", folder="cifar-10-batches-py", archive="cifar-10-python.tar.gz",
                    train=[f"data_batch_{i}" for i in range(1, 6)], val=["test_batch"], label_key=b"labels",
                    tv_class="CIFAR10"),
    "cifar100": dict(title="CIFAR-100", folder="cifar-100-python", archive="cifar-100-python.tar.gz",
                     train=["train"], val=["test"], label_key=b"fine_labels", tv_class="CIFAR100"),
}

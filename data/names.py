"""The data vocabularies the config schema, the dataset declarations and the data code share,
importable without torch (the config loader checks a command line before torch loads): requested
splits, decoding backends, the training crop recipes (data/transforms.py builds each recipe; a
dataset's declaration in data/registry.py names the one data.train_crop=auto means for it), the
resize interpolations, the far-OOD generators (data/far_ood.py), the CIFAR archives' layout
(data/cifar.py reads them) and the MNIST family's IDX files (data/idx.py reads them)."""
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

# The MNIST family as torchvision lays it out: ROOT/<folder>/raw/<file>[.gz] for each of IDX_FILES,
# `tv_class` its torchvision.datasets class (the download); `debian`: the Debian package that ships
# the four .gz files in DEBIAN_DATASETS/<its folder> (data.root=DEBIAN_DATASETS reads them there).
# mean/std: of the train split's pixels / 255 (the same in the three channels: data.mean/data.std).
IDX = {
    "fashion_mnist": dict(title="Fashion-MNIST", folder="FashionMNIST", tv_class="FashionMNIST",
                          debian=("dataset-fashion-mnist", "fashion-mnist"), mean=0.2860, std=0.3530),
    "mnist": dict(title="MNIST", folder="MNIST", tv_class="MNIST", debian=None, mean=0.1307, std=0.3081),
    "kmnist": dict(title="Kuzushiji-MNIST", folder="KMNIST", tv_class="KMNIST", debian=None, mean=0.1918,
                   std=0.3483),
}
IDX_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
             "val": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}  # (images, labels) of a split
DEBIAN_DATASETS = "/usr/share/datasets"  # where Debian's dataset-* packages put their files

"""Webdataset-style tar shards: write them from an ImageFolder tree, read them by random access.

Layout of a shard folder (data.root with data.dataset=shards):

    classes.json              {"format": "resmlp-shards-1", "classes": [...], "splits": {"train": [...], "val": [...]}}
    train-000000.tar          members <key>.<ext> (the encoded image, bytes as in the folder) and
    train-000000.tar.idx      <key>.cls (the class index as ASCII), in ImageFolder sample order;
    ...                       the .idx sidecar lists "member offset size label" per image

A multi-node job then opens a few hundred large files instead of a million small ones. Samples
keep the ImageFolder order (sorted class, then file name), so sample i of the shards is sample i
of the folder: the loaders' permutations, labels and batches are identical on both formats.
Reading is random access (one pread per image at the offset in the sidecar, or in the tar
headers when the sidecar is missing): the loaders keep their global per-epoch permutation and
exact resume instead of webdataset's streaming shuffle buffer.
"""
import io
import json
import os
import tarfile

from PIL import Image

from common.errors import UserError
from common.io import write_json

from . import imagefolder
from .imagefolder import ImageFolderDataset

FORMAT = "resmlp-shards-1"
INDEX_NAME = "classes.json"


def _index_path(root):
    return os.path.join(root, INDEX_NAME)


def read_index(root):
    """classes.json of a shard folder (UserError if missing or not a shard index)."""
    path = _index_path(root)
    if not os.path.isfile(path):
        raise UserError(f"no shard index {os.path.abspath(path)}; write shards with "
                        "`python scripts/make_shards.py IMAGEFOLDER_ROOT SHARD_DIR` and set data.root to SHARD_DIR")
    try:
        with open(path) as f:
            index = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read shard index {os.path.abspath(path)} ({type(e).__name__}); rewrite it with "
                        "scripts/make_shards.py") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise UserError(f"{os.path.abspath(path)} is not a {FORMAT} shard index; "
                        "rewrite it with scripts/make_shards.py")
    return index


def _scan_tar(path):
    """[(member, offset, size, label)] from the tar headers (when the .idx sidecar is missing)."""
    images, labels = [], {}
    with tarfile.open(path, "r:") as tar:
        for info in tar:
            if not info.isfile():
                continue
            key, ext = os.path.splitext(info.name)
            if ext == ".cls":
                labels[key] = int(tar.extractfile(info).read().decode().strip())
            elif ext.lower() in imagefolder.IMG_EXTENSIONS:
                images.append((info.name, info.offset_data, info.size, key))
    missing = [m for m, _, _, key in images if key not in labels]
    if missing:
        raise UserError(f"shard {os.path.abspath(path)}: no .cls label for {missing[0]}; "
                        "rewrite it with scripts/make_shards.py")
    return [(m, off, size, labels[key]) for m, off, size, key in images]


def _read_shard_index(path):
    side = path + ".idx"
    if not os.path.isfile(side):
        return _scan_tar(path)
    rows = []
    with open(side) as f:
        for line in f:
            member, offset, size, label = line.rstrip("\n").rsplit(" ", 3)
            rows.append((member, int(offset), int(size), int(label)))
    return rows


class ShardDataset(ImageFolderDataset):
    """ImageFolderDataset over tar shards: samples are ("shard.tar:member", label); `read_bytes(i)`
    gives the encoded image, `load(i)` the PIL image with the same corrupt-file handling."""

    def __init__(self, samples, locations, classes, transform=None, skip_corrupt=False, skipped_files=None):
        super().__init__(samples, classes, transform, skip_corrupt, skipped_files)
        self.locations = locations  # [(shard path, offset, size)] per sample
        self._files = {}

    @classmethod
    def from_root(cls, root, split, skip_corrupt=False):
        index = read_index(root)
        classes = index["classes"]
        shards = index.get("splits", {}).get(split)
        if not shards:
            raise UserError(f"the shard index {os.path.abspath(_index_path(root))} has no '{split}' split; "
                            f"rewrite the shards from a folder with {split}/<class>/*.jpg")
        samples, locations = [], []
        for name in shards:
            path = os.path.join(root, name)
            if not os.path.isfile(path):
                raise UserError(f"missing shard {os.path.abspath(path)} listed in {INDEX_NAME}")
            for member, offset, size, label in _read_shard_index(path):
                if not 0 <= label < len(classes):
                    raise UserError(f"shard {os.path.abspath(path)}: label {label} of {member} is outside the "
                                    f"{len(classes)} classes of {INDEX_NAME}")
                samples.append((f"{path}:{member}", label))
                locations.append((path, offset, size))
        return cls(samples, locations, classes, skip_corrupt=skip_corrupt)

    def subset(self, indices):
        return ShardDataset([self.samples[i] for i in indices], [self.locations[i] for i in indices], self.classes,
                            self.transform, self.skip_corrupt, self.skipped_files)

    def __getstate__(self):  # loader workers reopen the shards
        state = dict(self.__dict__)
        state["_files"] = {}
        return state

    def read_bytes(self, i):
        path, offset, size = self.locations[i]
        fd = self._files.get(path)
        if fd is None:
            fd = self._files[path] = os.open(path, os.O_RDONLY)
        return os.pread(fd, size, offset)

    def __del__(self):
        for fd in getattr(self, "_files", {}).values():
            try:
                os.close(fd)
            except OSError:
                pass

    def open_image(self, i):  # ImageFolderDataset.load decodes it, with the same corrupt-file handling
        return Image.open(io.BytesIO(self.read_bytes(i)))


def class_names(root):
    return list(read_index(root)["classes"])


def build_split(data_cfg, split):
    """Split 'train' or 'val' of the shard folder data.root (data/registry.py declares it)."""
    return ShardDataset.from_root(data_cfg.root, split, skip_corrupt=data_cfg.skip_corrupt)


def _add(tar, name, payload):
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(payload), 0, 0o644  # mtime 0: identical inputs give identical shards
    tar.addfile(info, io.BytesIO(payload))  # writes a copy of `info`: compute the data offset ourselves
    return tar.offset - -(-len(payload) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def write_shards(src_root, out_dir, *, max_count=5000, max_bytes=1 << 30, splits=("train", "val"), log=print):
    """ImageFolder tree -> tar shards + classes.json in out_dir. Returns the index dict."""
    classes = imagefolder.find_classes(src_root)
    os.makedirs(out_dir, exist_ok=True)
    index = {"format": FORMAT, "classes": classes, "splits": {}}
    for split in splits:
        if not os.path.isdir(os.path.join(src_root, split)):
            continue
        samples, _ = imagefolder.scan_split(src_root, split)
        names, tar, side, count, size = [], None, None, 0, 0
        for i, (path, label) in enumerate(samples):
            if tar is None or count >= max_count or size >= max_bytes:
                if tar is not None:
                    tar.close()
                    side.close()
                names.append(f"{split}-{len(names):06d}.tar")
                tar = tarfile.open(os.path.join(out_dir, names[-1]), "w", format=tarfile.USTAR_FORMAT)
                side = open(os.path.join(out_dir, names[-1]) + ".idx", "w")
                count = size = 0
            with open(path, "rb") as f:
                payload = f.read()
            member = f"{i:08d}{os.path.splitext(path)[1].lower()}"
            offset = _add(tar, member, payload)
            _add(tar, f"{i:08d}.cls", str(label).encode())
            side.write(f"{member} {offset} {len(payload)} {label}\n")
            count, size = count + 1, size + len(payload)
        if tar is not None:
            tar.close()
            side.close()
        index["splits"][split] = names
        log(f"{split}: {len(samples)} images in {len(names)} shard(s)")
    if not index["splits"]:
        raise UserError(f"no train/ or val/ folder in {os.path.abspath(src_root)}")
    write_json(index, _index_path(out_dir))  # last: a folder with classes.json is complete
    return index

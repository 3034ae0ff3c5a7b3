"""Write webdataset-style tar shards (+ classes.json) from an ImageFolder tree.

    python scripts/make_shards.py IMAGEFOLDER_ROOT SHARD_DIR [--max-count 5000] [--max-gb 1.0]

IMAGEFOLDER_ROOT holds train/<class>/*.jpg (and val/<class>/*.jpg); SHARD_DIR receives
train-000000.tar, ..., val-000000.tar, one .idx offset sidecar per shard, and classes.json.
Train with `data.dataset=shards data.root=SHARD_DIR` (either data.backend). Samples keep the
folder's order and bytes, so a run on the shards sees the same batches as one on the folder.
"""
import argparse
import os

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.cli import run_cli
from common.errors import UserError
from common.io import writing
from data.shards import INDEX_NAME, write_shards


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", help="ImageFolder root (with train/ and/or val/)")
    p.add_argument("dst", help="output folder for the shards and classes.json")
    p.add_argument("--max-count", type=int, default=5000, help="images per shard at most (default 5000)")
    p.add_argument("--max-gb", type=float, default=1.0, help="shard size in GB at most (default 1.0)")
    args = p.parse_args(argv)
    if args.max_count < 1 or args.max_gb <= 0:
        raise UserError("--max-count must be >= 1 and --max-gb > 0")
    with writing(args.dst):  # a full disk or read-only folder: one line, exit 74
        write_shards(args.src, args.dst, max_count=args.max_count, max_bytes=int(args.max_gb * (1 << 30)))
    print(f"wrote {os.path.join(args.dst, INDEX_NAME)}")
    return 0


if __name__ == "__main__":
    run_cli(main)

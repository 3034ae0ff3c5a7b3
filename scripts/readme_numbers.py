"""The recorded comparisons' numbers in the docs (README.md, docs/quickstart.md, docs/results.md), generated
from their records.

    python scripts/readme_numbers.py            # rewrite the generated blocks from the records
    python scripts/readme_numbers.py --check    # change nothing; exit 1 naming the first block that differs
    python scripts/readme_numbers.py --record runs/compare/quickstart_compare [--overwrite]
    python scripts/readme_numbers.py --of fashion_mnist --record runs/compare/fashion_mnist_e30_heads

The records (docs/quickstart_record/, docs/fashion_mnist_record/), how the blocks are made and the options:
comparison/report/readme_numbers.py,
beside the report it rebuilds. Bad input is one line and exit 2 (common/cli.py).
"""
import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.cli import run_cli
from comparison.report.readme_numbers import main

if __name__ == "__main__":
    run_cli(main)

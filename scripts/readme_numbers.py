"""The quick start's numbers in README.md and docs/quickstart.md, generated from a recorded quick start.

    python scripts/readme_numbers.py            # rewrite the generated blocks from the record
    python scripts/readme_numbers.py --check    # change nothing; exit 1 naming the first block that differs
    python scripts/readme_numbers.py --record runs/compare/quickstart_compare [--overwrite]

The record (docs/quickstart_record/), how the blocks are made and the options: comparison/report/readme_numbers.py,
beside the report it rebuilds. Bad input is one line and exit 2 (common/cli.py).
"""
import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.cli import run_cli
from comparison.report.readme_numbers import main

if __name__ == "__main__":
    run_cli(main)

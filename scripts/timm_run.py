"""Run one of timm's own scripts (validate.py, inference.py, ...) with this project's models registered.

    python scripts/timm_run.py PATH/TO/pytorch-image-models/validate.py DATA_DIR --model resmlp_tiny \\
        --checkpoint RUN_DIR/model.safetensors --num-classes 10 --crop-pct 1.0 --class-map RUN_DIR/class_map.txt

timm's scripts build models by name through timm's registry; importing this project's `models`
package registers resmlp_tiny, resmlp_cifar_s12, ... there, so `--model` takes them and
`--checkpoint` takes a run's own weights file. The script then runs exactly as
`python SCRIPT ARGS...` would (same argv, run as __main__). For the paper's variants a
`scripts/export.py --format timm` folder needs no wrapper: `--model local-dir:FOLDER`.
"""
import os
import runpy
import sys

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)


def main(argv):
    if not argv or not os.path.isfile(argv[0]):
        print("error: give the path of a timm script first, e.g. pytorch-image-models/validate.py, then its "
              "arguments", file=sys.stderr)
        return 2
    # heavy: torch and timm (seconds), after the check; the import registers the project's ResMLP variants
    import models.resmlp  # noqa: F401

    script = os.path.abspath(argv[0])
    sys.argv = [script, *argv[1:]]
    sys.path.insert(0, os.path.dirname(script))  # as `python SCRIPT` has it (the layering test's one exception)
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

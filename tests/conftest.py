import os
import sys

# Tests import the project packages (models, data, configs) from the repository root.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

# Two cores: keep intra-op threads bounded so parallel test processes don't oversubscribe.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

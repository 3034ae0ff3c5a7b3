"""Typed configs (configs/schema.py) and their YAML loader (configs/loader.py).

    cfg = load_config("configs/quickstart.yaml", ["optim.lr=1e-3", "head.name=sparsemax"])
"""
import os

from .describe import config_help, describe_config
from .loader import config_from_dict, config_to_dict, load_config, load_run_config, parse_override, save_config
from .schema import Config, DataConfig, HeadConfig, ModelConfig, OptimConfig, TrainConfig

CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))

__all__ = [
    "Config", "DataConfig", "HeadConfig", "ModelConfig", "OptimConfig", "TrainConfig",
    "load_config", "load_run_config", "save_config", "config_from_dict", "config_to_dict",
    "parse_override", "config_help", "describe_config", "CONFIG_DIR",
]

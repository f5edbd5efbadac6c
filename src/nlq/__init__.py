"""nlq: transformers whose attention query projection is linear, identity, or nonlinear."""

from nlq.config import DataConfig, DistConfig, ModelConfig, RunConfig, TrainConfig
from nlq.model import Transformer
from nlq.projections import PROJECTIONS, build_projection

__all__ = ["DataConfig", "DistConfig", "ModelConfig", "RunConfig", "TrainConfig", "Transformer", "PROJECTIONS",
           "build_projection"]
__version__ = "0.1.0"

"""nlq: transformers whose attention query projection is linear, identity, or nonlinear.

`import nlq` is light: names load on first use, so `from nlq import NonlinearQuery` needs torch alone and
`nlq --help` starts without importing torch.
"""

from importlib import import_module

__version__ = "0.2.0"

_EXPORTS = {
    "NonlinearQuery": "nlq.projections", "PROJECTIONS": "nlq.projections", "build_projection": "nlq.projections",
    "Projection": "nlq.projections", "register_projection": "nlq.projections",
    "Transformer": "nlq.model",
    "DataConfig": "nlq.config", "DistConfig": "nlq.config", "ModelConfig": "nlq.config", "RunConfig": "nlq.config",
    "TrainConfig": "nlq.config",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'nlq' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)

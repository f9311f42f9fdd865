"""lazytrain: detectron2-style LazyConfig training recipes on Hydra.

Importing the top-level package is cheap on purpose (no torch import); the subpackages are imported where
needed. `lazytrain.program` turns a config into a run (command line, Hydra jobs, the default program, the
preflight checks); below it, receiving built objects: `lazytrain.engine`, `lazytrain.evaluation`,
`lazytrain.data`, `lazytrain.modeling`, `lazytrain.launch`, `lazytrain.config`, `lazytrain.utils`
(docs/architecture.md, "Layers"). `lazytrain.Predictor` (`lazytrain.program.predictor`) runs a trained
run's model on new images.
"""

__version__ = "0.1.0"
__all__ = ["Predictor"]


def __getattr__(name: str):
    # ``from lazytrain import Predictor`` imports torch and the model code on first use only.
    if name == "Predictor":
        from lazytrain.program.predictor import Predictor

        return Predictor
    raise AttributeError(f"module 'lazytrain' has no attribute {name!r}")

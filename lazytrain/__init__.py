"""lazytrain: detectron2-style LazyConfig training recipes on Hydra.

Importing the top-level package is cheap on purpose (no torch import); the subpackages
(`lazytrain.config`, `lazytrain.engine`, `lazytrain.data`, `lazytrain.modeling`,
`lazytrain.evaluation`, `lazytrain.launch`, `lazytrain.utils`) are imported where needed.
"""

__version__ = "0.1.0"

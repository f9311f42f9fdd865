"""Data: catalogs and dataset loaders (records as plain dicts), mappers, samplers and loader builders.

Import from the modules: `lazytrain.data.catalog`, `lazytrain.data.datasets.*`, `lazytrain.data.mappers`,
`lazytrain.data.transforms`, `lazytrain.data.samplers`, `lazytrain.data.mixture_sampler`,
`lazytrain.data.repeat_factors`, `lazytrain.data.common`, `lazytrain.data.build` (and the train loader's parts: `aspect_grouping`, `workers`, `batch_transport`).

Importing any of them runs this file first, which makes the package ready to use without further imports:

- the built-in data sets are handed to the catalog, which registers them on its first use (the catalog
  cannot import them itself: their loaders use the catalog);
- the ``lazytrain.json_*`` config resolvers are registered (`lazytrain.data.datasets.custom`), so a process
  that resolves a config on a user's json has them once it has imported anything from ``lazytrain.data``.
"""

from lazytrain.data import catalog
from lazytrain.data.datasets import builtin, custom

catalog.register_on_first_use(builtin.get_builtin_datasets())
custom.register_json_resolvers()  # its import did it (idempotent); called to say why custom is imported

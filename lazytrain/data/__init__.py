"""Data: catalogs and dataset loaders (records as plain dicts), mappers, samplers and loader builders.

Import from the modules: `lazytrain.data.catalog`, `lazytrain.data.datasets.*`, `lazytrain.data.mappers`,
`lazytrain.data.transforms`, `lazytrain.data.samplers`, `lazytrain.data.common`, `lazytrain.data.build`.

Importing any of them runs this file first, which registers the ``lazytrain.json_*`` config resolvers
(`lazytrain.data.datasets.custom`): a process that resolves a config on a user's json has them once it has
imported anything from ``lazytrain.data``.
"""

from lazytrain.data.datasets import custom

custom.register_json_resolvers()  # its import did it (idempotent); called to say why custom is imported

"""Data: catalogs and dataset loaders (records as plain dicts), mappers, samplers and loader builders.

Import from the modules: `lazytrain.data.catalog`, `lazytrain.data.datasets.*`, `lazytrain.data.mappers`,
`lazytrain.data.transforms`, `lazytrain.data.samplers`, `lazytrain.data.common`, `lazytrain.data.build`.
"""

"""Data recipes: loaders, mappers, samplers and evaluators of a data set (``lazytrain.recipes.data``)."""

"""Model recipes (``lazytrain.recipes.models``)."""

import os
import subprocess
import sys

from tests.data.test_catalog import BUILTIN

# Run in a fresh interpreter whose first lazytrain import is the catalog: nothing else is loaded before it.
_CATALOG_FIRST = """
import os
from lazytrain.data import catalog
print(sorted(catalog.DatasetCatalog._functions))
print("coco_2017_val" in catalog.DatasetCatalog)
print(sorted(catalog.DatasetCatalog._functions))
print(catalog.MetadataCatalog.get("synthetic_lt_train").evaluator_type)
os.environ["LAZYTRAIN_DATASETS"] = os.environ["LAZYTRAIN_DATASETS"] + "_later"
try:
    catalog.DatasetCatalog.get("coco_2017_val")
except FileNotFoundError as e:
    print("_later" in str(e))
"""


def test_catalog_imported_first_registers_the_builtins_on_first_use_without_io(tmp_path):
    root = tmp_path / "datasets"
    env = {**os.environ, "LAZYTRAIN_DATASETS": str(root)}
    result = subprocess.run([sys.executable, "-c", _CATALOG_FIRST], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    # Nothing registered at import, all built-ins at the first use, the root read when a set is loaded.
    assert result.stdout.splitlines() == ["[]", "True", str(sorted(BUILTIN)), "lvis", "True"]
    assert os.listdir(tmp_path) == []  # registering touched no file

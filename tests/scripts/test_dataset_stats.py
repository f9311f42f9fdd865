"""scripts/dataset_stats.py on a user's json: buckets, and epoch length and factors per candidate threshold."""

from lazytrain.data.catalog import DatasetCatalog, MetadataCatalog
from tests.data.custom_fixtures import write_export
from tests.scripts.loading import load_script


def test_json_stats_list_buckets_and_each_candidate_threshold(tmp_path, capsys):
    paths = write_export(str(tmp_path))  # 8 train images; categories in 4, 2, 4, 2 and 0 of them
    try:
        load_script("dataset_stats").main(
            ["--json", paths["data.train.json"], "--frequency-thresholds", "2", "3"]
        )
    finally:
        DatasetCatalog.remove("dataset_stats_train")
        MetadataCatalog.remove("dataset_stats_train")
    out = capsys.readouterr().out
    assert "r <= 2, c <= 3, f > 3 images" in out
    assert "| r | 3 (60%) | 0-2 | 4 | 4 |" in out  # ids 3, 12 (2 images each) and the unused 41
    assert "| f | 2 (40%) | 4-4 | 8 | 8 |" in out
    assert "100 / train images = 1: the custom recipe's default repeat_thresh" in out
    # t=1: every category is in fewer than 8 images; rare ones (2 of 8) get sqrt(4) = 2, frequent sqrt(2)
    assert "| 1 | 14 | 1.71 | 8 | 2.00 | 1.00-2.00 | 1.41-1.41 |" in out
    assert "| 0.001 | 8 | 1.00 | 0 | 1.00 | 1.00-1.00 | 1.00-1.00 |" in out

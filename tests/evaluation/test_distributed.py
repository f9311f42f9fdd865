"""Two CPU processes (gloo): each evaluates half the images; rank 0 gathers and scores them all."""

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lazytrain.evaluation import COCOEvaluator, inference_on_dataset
from tests.evaluation.data import ground_truth_as_outputs, make_ground_truth, write_json
from tests.warm_command import warm_context


class _Replay(torch.nn.Module):
    """Answers each image with its prepared output."""

    def __init__(self, outputs_by_id):
        super().__init__()
        self.outputs_by_id = outputs_by_id

    def forward(self, inputs):
        return [self.outputs_by_id[record["image_id"]] for record in inputs]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, json_file, result_file, output_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        torch.set_num_threads(1)
        data = make_ground_truth()
        inputs, outputs = ground_truth_as_outputs(data)
        shard = [[record] for record in inputs[rank::world_size]]
        model = _Replay({record["image_id"]: output for record, output in zip(inputs, outputs)})
        results = inference_on_dataset(
            model, shard, COCOEvaluator(json_file=json_file, output_dir=output_dir)
        )
        torch.save(results, f"{result_file}.{rank}")
        dist.barrier()  # no rank tears gloo down while the other still talks to it (seen: SIGABRT, rarely)
    finally:
        dist.destroy_process_group()


def test_results_are_gathered_on_rank_0(tmp_path):
    data = make_ground_truth()
    json_file = write_json(data, tmp_path / "gt.json")
    result_file = str(tmp_path / "results")
    output_dir = tmp_path / "eval"
    arguments = (2, _free_port(), json_file, result_file, str(output_dir))
    warm_context()  # the ranks are forked from the test process's warm server
    mp.start_processes(_worker, args=arguments, nprocs=2, join=True, start_method="forkserver")
    rank0, rank1 = (torch.load(f"{result_file}.{rank}") for rank in (0, 1))
    assert rank1 == {}
    assert rank0["bbox"]["AP"] == 100.0 and rank0["segm"]["AP"] == 100.0
    # Rank 0 scored (and wrote) the predictions of both shards.
    written = json.loads((output_dir / "coco_instances_results.json").read_text())
    assert len(written) == len(data["annotations"])
    assert {entry["image_id"] for entry in written} == {image["id"] for image in data["images"]}

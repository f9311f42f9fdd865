"""Two CPU processes (gloo): AP-fixed and AP-pool of a run split over processes equal one process's, each
process sends at most K detections per category, and the main process takes the shares one at a time
(`comm.gather_in_turn`)."""

from __future__ import annotations

import math
import os
import socket

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lazytrain.evaluation import LVISEvaluator
from lazytrain.utils import comm
from tests.evaluation.data import ground_truth_as_outputs, make_ground_truth, write_json
from tests.warm_command import warm_context

K = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, json_file: str, result_file: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        data = make_ground_truth(num_images=9, seed=4, lvis=True)
        inputs, outputs = ground_truth_as_outputs(data, noise=4.0, seed=4)
        # Rank 1 also gets rank 0's first image, as a padding sampler gives it.
        share = list(range(rank, 9, 2)) + ([0] if rank == 1 else [])
        evaluator = LVISEvaluator(json_file=json_file, ap_fixed=True, ap_pool=True, max_dets_per_category=K)
        evaluator.process([inputs[i] for i in share], [outputs[i] for i in share])
        sent = []
        gather_in_turn = comm.gather_in_turn

        def watched(value, dst=0):
            sent.append(value)
            received = []
            for state in gather_in_turn(value, dst):
                received.append(len(state[1]))
                yield state

            if rank == 0:
                sent.append(received)

        comm.gather_in_turn = watched
        results = evaluator.evaluate()
        image_ids, kept = sent[0]
        per_category = np.unique(np.concatenate([p.category_ids for p in kept]), return_counts=True)[1]
        torch.save((results, image_ids, per_category.max(), sent[1:]), f"{result_file}.{rank}")
        dist.barrier()  # no rank tears gloo down while the other still talks to it
    finally:
        dist.destroy_process_group()


def test_two_processes_give_one_process_metrics(tmp_path):
    data = make_ground_truth(num_images=9, seed=4, lvis=True)
    json_file = write_json(data, tmp_path / "lvis.json")
    inputs, outputs = ground_truth_as_outputs(data, noise=4.0, seed=4)
    single = LVISEvaluator(json_file=json_file, ap_fixed=True, ap_pool=True, max_dets_per_category=K)
    single.process(inputs, outputs)
    expected = single.evaluate()
    warm_context()  # the ranks are forked from the test process's warm server
    result_file = str(tmp_path / "results")
    mp.start_processes(
        _worker, args=(_free_port(), json_file, result_file), nprocs=2, join=True, start_method="forkserver"
    )
    (results, ids0, most0, received), (other, ids1, most1, nothing) = (
        torch.load(f"{result_file}.{rank}", weights_only=False) for rank in (0, 1)
    )
    assert other == {} and nothing == []
    assert ids0 == [1, 3, 5, 7, 9] and ids1 == [1, 2, 4, 6, 8]
    assert most0 <= K and most1 <= K  # each process sent at most K of a category
    assert len(received) == 1 and len(received[0]) == 2  # rank 0 took both shares, in turn
    assert results.keys() == expected.keys()
    for task in expected:
        for name, value in expected[task].items():
            assert math.isclose(results[task][name], value) or (
                math.isnan(value) and math.isnan(results[task][name])
            ), (task, name)

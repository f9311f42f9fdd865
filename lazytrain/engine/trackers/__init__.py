"""Experiment trackers as hooks: `lazytrain.engine.trackers.mlflow.MLflowTracker` and
`lazytrain.engine.trackers.wandb.WandbTracker` send a run's config, its metrics and its plots to MLflow or
Weights & Biases. Each is a hook like the others, added to ``train.hooks``::

    python -m lazytrain conf/rfs_maskrcnn_demo.py \\
        '+train.hooks.mlflow={_target_: lazytrain.engine.trackers.mlflow.MLflowTracker, output_dir: ${train.output_dir}}'

or, in a config file, ``train.hooks.mlflow = L(MLflowTracker)(output_dir="${train.output_dir}")``. Place a
tracker after the writer and plot hooks (the end of the mapping, where ``+`` puts it), so that it logs the final
evaluation and uploads the finished plots.

What a tracker logs (the same for both):

- params: the run's ``config.yaml``, flattened to ``model.backbone.depth``-style keys, with values resolved;
- metrics: every `period` iterations and at the end, the values ``metrics.json`` gets (windowed medians of
  losses, the LR, evaluation results at the iteration they belong to), with the iteration as the step;
- files at the end of training: the run directory's plots, per-category CSV, ``metrics.json`` and
  ``config.yaml`` (`artifacts`).

Rank 0 only, and never a reason for a run to fail or to wait long: the calls run in a worker thread with a
time bound, a failure is one line, the unsent metrics are kept and sent when the store answers again, and after
a bounded time of failures the tracker gives up, in one line. The end-of-run report says what each tracker holds
and what it lacks. Only a missing package is an error, at construction, before training starts.
``train.resume=true`` continues the same tracker run: its id is hook state, saved in every checkpoint.

Modules: `base` (the `Tracker` hook: when to log what, the buffer, failures, the run id), `run_info` (the
config as params, run and sweep names), `delivery` (calls bounded in time in a worker thread, the retry
schedule, one-line errors, the library's logs to ``log.txt``), `mlflow` (`MLflowTracker`), `wandb`
(`WandbTracker`). The libraries are optional (``pip install "lazytrain[mlflow]"``, ``"lazytrain[wandb]"``)
and imported by the main process when training starts, so ``import lazytrain`` stays lean. Another tracker
subclasses `Tracker` and implements its five methods.
"""

"""Run settings, the trainer and the default hooks (a named mapping in run order).

The trainer and hooks are config nodes like the model. The default program (`lazytrain.program.default`)
builds model, optimizer and train loader once and injects them: ``instantiate(train.trainer, model=...,
data_loader=..., optimizer=...)``; it attaches ``trainer.checkpointer`` and ``trainer.test_function``; hooks
reach all of these through ``self.trainer`` and hold only plain values here, so this block saves to YAML.

    ~train.hooks.eval                                   remove a hook
    train.hooks.checkpointer.max_to_keep=3              change one of its arguments
    +train.hooks.profiler="{_target_: lazytrain.engine.hooks.TorchProfiler, output_dir: ${train.output_dir}}"
    '+train.hooks.mlflow={_target_: lazytrain.engine.trackers.mlflow.MLflowTracker, output_dir: ${train.output_dir}}'
                                                        an experiment tracker (README "Tracking"; or WandbTracker)
    train.trainer._target_=my_module.MyTrainer          swap the trainer (a SimpleTrainer subclass)

In a config file, ``train.hooks.my_hook = L(MyHook)(...)`` adds one (dict order is run order). Keep ``eval``
before ``writer`` so the final evaluation reaches ``metrics.json``. ``resume=True`` continues from
``output_dir/last_checkpoint`` exactly, or starts fresh with a warning when there is none.

The batch and the weights (README, "Batch size, accumulation, EMA"):

    train.images_per_forward=2          gradient accumulation: dataloader.train.total_batch_size stays the batch
                                        of one optimizer step; each process runs its share 2 images at a time
    train.auto_scale_lr.enabled=true    lr x total_batch_size / base_batch_size (mmdet's auto_scale_lr)
    train.ema.enabled=true              an EMA of the weights (engine/ema.py): evaluated, and saved as the
                                        checkpoints' "model" (predict and export use it)
"""

from lazytrain.config import LazyCall as L
from lazytrain.engine import hooks
from lazytrain.engine.plot_writer import PlotWriter
from lazytrain.engine.train_loop import SimpleTrainer

train = dict(
    output_dir="./output",  # under `python -m lazytrain`: the Hydra job directory (hydra.run.dir)
    max_iter=90000,
    seed=0,  # each rank seeds seed + rank; negative: one random seed shared by all ranks
    device="cuda",  # or "cpu"
    init_checkpoint="",  # initial weights (non-strict); also the weights evaluated when eval_only
    resume=False,
    eval_only=False,
    allow_unsafe_checkpoint=False,  # load checkpoints needing arbitrary unpickling (trusted files only)
    log_period=20,
    verbose=False,  # True: also print the full config, environment and model on the console (always in log.txt)
    eval_period=5000,  # 0: evaluate only after training
    amp=dict(enabled=False, dtype="bfloat16"),  # or "float16" (with a checkpointed grad scaler)
    # cuDNN times its convolution algorithms per new input shape (pays when shapes repeat, e.g. LSJ's 1024 px).
    cudnn_benchmark=False,
    # torch.set_float32_matmul_precision: "high" runs fp32 matmuls in TF32 (Ampere+; changes fp32 numerics).
    float32_matmul_precision="highest",
    # torch.compile of the backbone + FPN in training (RCNN.compile_backbone): fixed shapes only, so pad
    # training batches to fixed sizes (model.pad_to_sizes=[[1024,1024]]); mode="reduce-overhead": CUDA graphs.
    compile=dict(enabled=False, mode=None, backend="inductor"),
    clip_grad=dict(enabled=False, max_norm=None),  # e.g. enabled=True, max_norm=10.0 (global gradient norm)
    checkpointer=dict(period=5000, max_to_keep=None),  # None keeps every periodic checkpoint
    # Images per process and forward pass; None: the whole share of total_batch_size at once. Must divide it.
    images_per_forward=None,
    # lr x dataloader.train.total_batch_size / base_batch_size, the batch recipes/optim.py's lr 0.02 is for.
    auto_scale_lr=dict(enabled=False, base_batch_size=16),
    # decay after t optimizer steps: decay * (1 - exp(-t / tau)); 0.9998 averages over ~5000 steps.
    ema=dict(enabled=False, decay=0.9998, tau=2000),
    ddp=dict(find_unused_parameters=False, broadcast_buffers=False, gradient_as_bucket_view=True),
    trainer=L(SimpleTrainer)(
        clip_grad_enabled="${train.clip_grad.enabled}",
        clip_grad_max_norm="${train.clip_grad.max_norm}",
        amp_enabled="${train.amp.enabled}",
        amp_dtype="${train.amp.dtype}",
        images_per_forward="${train.images_per_forward}",
    ),
    hooks=dict(
        timer=L(hooks.IterationTimer)(),
        lr_scheduler=L(hooks.LRScheduler)(multiplier="${lr_multiplier}"),
        checkpointer=L(hooks.PeriodicCheckpointer)(
            period="${train.checkpointer.period}", max_to_keep="${train.checkpointer.max_to_keep}"
        ),
        eval=L(hooks.EvalHook)(eval_period="${train.eval_period}"),
        writer=L(hooks.PeriodicWriter)(output_dir="${train.output_dir}", period="${train.log_period}"),
        plots=L(PlotWriter)(output_dir="${train.output_dir}"),  # curves.png, ap_by_frequency.png
    ),
)

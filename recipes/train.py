"""Run settings, the trainer and the default hooks (a named mapping in run order).

Remove a hook with ``~train.hooks.eval``, tune one with ``train.hooks.checkpointer.max_to_keep=3``, add one
with ``+train.hooks.profiler="{_target_: lazytrain.engine.hooks.TorchProfiler, output_dir: ...}"`` or in a
config file: ``train.hooks.my_hook = L(MyHook)(...)``. Swap the trainer with
``train.trainer._target_=my_module.MyTrainer``. The program passes model, data_loader and optimizer to the
trainer; hooks reach them (and the checkpointer and test function) through ``self.trainer``.
"""

from lazytrain.config import LazyCall as L
from lazytrain.engine import hooks
from lazytrain.engine.train_loop import SimpleTrainer

train = dict(
    output_dir="./output",  # under `python -m lazytrain`: the Hydra job directory (hydra.run.dir)
    max_iter=90000,
    seed=0,  # each rank seeds seed + rank; negative: one random seed shared by all ranks
    device="cuda",
    init_checkpoint="",
    resume=False,
    eval_only=False,
    allow_unsafe_checkpoint=False,
    log_period=20,
    eval_period=5000,
    amp=dict(enabled=False, dtype="bfloat16"),
    clip_grad=dict(enabled=False, max_norm=None),  # e.g. enabled=True, max_norm=10.0 (global gradient norm)
    checkpointer=dict(period=5000, max_to_keep=None),
    ddp=dict(find_unused_parameters=False, broadcast_buffers=False, gradient_as_bucket_view=True),
    trainer=L(SimpleTrainer)(
        clip_grad_enabled="${train.clip_grad.enabled}",
        clip_grad_max_norm="${train.clip_grad.max_norm}",
        amp_enabled="${train.amp.enabled}",
        amp_dtype="${train.amp.dtype}",
    ),
    hooks=dict(
        timer=L(hooks.IterationTimer)(),
        lr_scheduler=L(hooks.LRScheduler)(multiplier="${lr_multiplier}"),
        checkpointer=L(hooks.PeriodicCheckpointer)(
            period="${train.checkpointer.period}", max_to_keep="${train.checkpointer.max_to_keep}"
        ),
        eval=L(hooks.EvalHook)(eval_period="${train.eval_period}"),
        writer=L(hooks.PeriodicWriter)(output_dir="${train.output_dir}", period="${train.log_period}"),
    ),
)

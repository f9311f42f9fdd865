"""The engine: the hook-driven trainer, standard hooks, checkpointing and the default programs.

Modules: `train_loop` (HookBase, TrainerBase, SimpleTrainer), `hooks`, `checkpoint` (Checkpointer),
`lr_schedule` (LR multipliers), `optimizer` (param groups), `defaults` (default_setup, do_train, do_test, run).
"""

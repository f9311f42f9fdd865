"""The program layer: everything that reads the whole config and turns it into a run.

- `entrypoint`: ``python -m lazytrain CONFIG [overrides]``, the command line into Hydra.
- `primary_config`: the CONFIG file with the launch defaults and Hydra settings.
- `preflight`: every check before a run starts (one package, two entry points).
- `job`: one Hydra job: config prepared (`job_config`), checked, processes started, objective returned.
- `default`: the default per-rank program (`run`, `do_train`, `do_test`, `default_setup`).
- `run_report`: the run's console header and closing summary; `objective`: what a search sweep optimises;
  `sweep_summary`: the multirun summary tables and plot.

The layers below (`engine`, `data`, `modeling`, `evaluation`, `launch`, `config`, `utils`) receive built
objects or plain values, never the whole config (docs/architecture.md).
"""

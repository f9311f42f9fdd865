"""A config whose per-rank program only records ranks (no model)."""

train = dict(output_dir="./output", lr=0.5, device="cpu")
launch = dict(main="tests.launch.toy_main.record_ranks", num_processes=2)

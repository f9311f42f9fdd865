"""``python -m lazytrain ARGS`` for tests of what the command does before it trains: one-line errors, help, the
printed config. Each call runs in a process forked from a server that imported torch, torchvision, Hydra and
lazytrain once (multiprocessing's forkserver, started by the first call of each test process), instead of a
new interpreter importing them again: about 4-5 s of CPU a command on the 2-core machine. The forked process
is otherwise a new one: no test has run in the server, and the command gets its own argv, working directory,
environment, stdout and stderr, as `subprocess.run` gives them.

Commands that train, spawn ranks or are stopped by signals run as real subprocesses (e.g.
`tests.launch.test_entrypoint.lazytrain`): the server's torch was loaded with its own OpenMP settings.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
import traceback

# What `python -m lazytrain CONFIG ...` imports before its checks: the slow part of starting it.
_PRELOAD = ["torch", "torchvision", "hydra.main", "lazytrain.program.default", "lazytrain.program.preflight"]


def run_warm(argv: list[str], cwd, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m lazytrain *argv`` in `cwd` with exactly `env`: its exit status, stdout and stderr."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)  # no effect once this test process's server runs
    with tempfile.TemporaryDirectory(prefix="lazytrain_warm_") as outputs:
        out, err = os.path.join(outputs, "stdout"), os.path.join(outputs, "stderr")
        process = context.Process(target=_run_command, args=(list(argv), str(cwd), dict(env), out, err))
        process.start()
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(["python", "-m", "lazytrain", *argv], timeout)
        with open(out) as stdout, open(err) as stderr:
            return subprocess.CompletedProcess(
                ["python", "-m", "lazytrain", *argv], process.exitcode, stdout.read(), stderr.read()
            )


def _run_command(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str) -> None:
    """In the forked process: what the interpreter does for ``python -m lazytrain``, then exit as it would."""
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(file, fd)
        os.close(file)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["-m", *argv]  # run_module puts lazytrain/__main__.py first, as `python -m` does
    code = 0
    try:
        runpy.run_module("lazytrain", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_status(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_status(exit: SystemExit) -> int:
    """The status the interpreter exits with for `exit`: None is 0, a message is printed and gives 1."""
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)
    return 1

"""``python -m lazytrain ARGS`` for tests, in a process forked from a server that imported torch, torchvision,
Hydra and lazytrain once (multiprocessing's forkserver, started by the first call of each test process) instead
of a new interpreter importing them again: several seconds of CPU a command on a 2-core machine. The forked
process is otherwise a new one: no test has run in the server, and the command gets its own argv, working
directory, `sys.path`, environment, torch threads, stdout and stderr as a new interpreter would, and its
threads are joined and exit handlers run at its end.

Commands that a test stops with signals from outside, or that must be a process of their own (the launcher's
parent), run as real subprocesses; a command that kills its own process group from inside (a callback of the
run) gets a session of its own (`new_session`).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import traceback

# What `python -m lazytrain CONFIG ...` imports before its checks: the slow part of starting it.
_PRELOAD = ["torch", "torchvision", "hydra.main", "lazytrain.program.default", "lazytrain.program.preflight"]
# A server started by `lazytrain.launch.rank_server` (a test that launched ranks in this process) blocks these.
_JOB_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def run_warm(
    argv: list[str],
    cwd,
    env: dict[str, str],
    timeout: float = 120,
    new_session: bool = False,
    ignore_sigint: bool = False,
) -> subprocess.CompletedProcess:
    """``python -m lazytrain *argv`` in `cwd` with exactly `env`: its exit status, stdout and stderr. With
    `new_session`, the command leads a session and process group of its own (`subprocess.run`'s
    ``start_new_session``), so that a kill of its process group from inside ends the command and its ranks
    only. SIGINT raises KeyboardInterrupt, as in an interpreter started from a terminal; with `ignore_sigint`
    it stays ignored, as in one started with SIGINT ignored (nohup, a script's background job)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)  # no effect once this test process's server runs
    with tempfile.TemporaryDirectory(prefix="lazytrain_warm_") as outputs:
        out, err = os.path.join(outputs, "stdout"), os.path.join(outputs, "stderr")
        process = context.Process(
            target=_run_command, args=(list(argv), str(cwd), dict(env), out, err, new_session, ignore_sigint)
        )
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


def _run_command(
    argv: list[str], cwd: str, env: dict[str, str], out: str, err: str, new_session: bool, ignore_sigint: bool
) -> None:
    """In the forked process: what the interpreter does for ``python -m lazytrain``, then exit as it would."""
    if new_session:
        os.setsid()
    # An interpreter installs KeyboardInterrupt for SIGINT at its start unless SIGINT came to it ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.default_int_handler)
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(file, fd)
        os.close(file)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _start_as_a_new_interpreter(env)
    sys.argv = ["-m", *argv]  # run_module puts lazytrain/__main__.py first, as `python -m` does
    code = 0
    try:
        runpy.run_module("lazytrain", run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = _exit_status(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    _end_as_an_interpreter()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start_as_a_new_interpreter(env: dict[str, str]) -> None:
    """What a new ``python -m`` process in this working directory with `env` would have that the server's fork
    does not: the working directory and PYTHONPATH first on `sys.path`, the torch threads of OMP_NUM_THREADS,
    the stop signals unblocked."""
    paths = [os.getcwd(), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    sys.path[:0] = [p for p in paths if p not in sys.path]
    if env.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _JOB_SIGNALS)


def _end_as_an_interpreter() -> None:
    """What an interpreter does before it exits: wait for its non-daemon threads, run the exit handlers (those
    registered by the command: trackers finishing, process pools joined), flush the logs."""
    threading._shutdown()  # the interpreter's own step: thread-exit hooks (executors), then non-daemon threads
    atexit._run_exitfuncs()
    logging.shutdown()


def _exit_status(exit: SystemExit) -> int:
    """The status the interpreter exits with for `exit`: None is 0, a message is printed and gives 1."""
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)
    return 1

"""``python -m lazytrain ARGS`` (or any ``python -m``/``-c`` command) for tests, in a process forked from a server that imported torch, torchvision,
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

from lazytrain.utils.preemption import JOB_SIGNALS

# What `python -m lazytrain CONFIG ...` imports before its checks: the slow part of starting it.
_PRELOAD = ["torch", "torchvision", "hydra.main", "lazytrain.program.default", "lazytrain.program.preflight"]


def warm_context() -> multiprocessing.context.BaseContext:
    """multiprocessing's forkserver context of this test process, whose server preloads what a lazytrain
    command imports: processes started with it (`torch.multiprocessing.start_processes(...,
    start_method="forkserver")` uses it too) skip those imports."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)  # no effect once this test process's server runs
    return context


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
    with start_warm(["-m", "lazytrain", *argv], cwd, env, new_session, ignore_sigint) as process:
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        stdout, stderr = process.read_output()
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


class WarmProcess:
    """A command started by `start_warm`, used as a `subprocess.Popen`: `poll`, `wait`, `kill`,
    `returncode`, and its output once it ended (`read_output`). A context manager that removes the output
    files on exit."""

    def __init__(self, args: list[str], cwd, env: dict[str, str], new_session: bool, ignore_sigint: bool):
        self.args = ["python", *args]
        self._outputs = tempfile.TemporaryDirectory(prefix="lazytrain_warm_")
        self._out = os.path.join(self._outputs.name, "stdout")
        self._err = os.path.join(self._outputs.name, "stderr")
        for path in (self._out, self._err):  # readable before the command opens them
            open(path, "w").close()
        context = warm_context()
        command = (list(args), str(cwd), dict(env), self._out, self._err, new_session, ignore_sigint)
        self._process = context.Process(target=_run_command, args=command)
        self._process.start()
        self.pid = self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._process.exitcode

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()

    def read_output(self) -> tuple[str, str]:
        """(stdout, stderr) so far."""
        with open(self._out) as stdout, open(self._err) as stderr:
            return stdout.read(), stderr.read()

    def __enter__(self) -> WarmProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.kill()
        self._process.join()
        self._outputs.cleanup()


def start_warm(
    args: list[str], cwd, env: dict[str, str], new_session: bool = False, ignore_sigint: bool = False
) -> WarmProcess:
    """``python *args`` (``-m MODULE ...`` or ``-c CODE ...``) started warm in `cwd` with exactly `env`;
    `run_warm` says what `new_session` and `ignore_sigint` do."""
    if args[:1] not in (["-m"], ["-c"]):
        raise ValueError(f"start_warm: args must start with -m or -c, got {args[:2]}")
    return WarmProcess(args, cwd, env, new_session, ignore_sigint)


def _run_command(
    args: list[str], cwd: str, env: dict[str, str], out: str, err: str, new_session: bool, ignore_sigint: bool
) -> None:
    """In the forked process: what the interpreter does for ``python *args``, then exit as it would."""
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
    code = 0
    try:
        _run_python_args(args)
    except SystemExit as e:
        code = _exit_status(e)
    except BaseException:
        traceback.print_exc()
        code = 1
    _end_as_an_interpreter()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_python_args(args: list[str]) -> None:
    """``python -m MODULE ARGS`` or ``python -c CODE ARGS`` in this process."""
    option, target, *rest = args
    if option == "-m":
        sys.argv = ["-m", *rest]  # run_module puts the module's file first, as `python -m` does
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *rest]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})


def _start_as_a_new_interpreter(env: dict[str, str]) -> None:
    """What a new ``python -m`` or ``python -c`` process in this working directory with `env` would have that
    the server's fork does not: the working directory and PYTHONPATH first on `sys.path`, the torch threads of
    OMP_NUM_THREADS, the stop signals unblocked."""
    paths = [os.getcwd(), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    sys.path[:0] = [p for p in paths if p not in sys.path]
    if env.get("OMP_NUM_THREADS", "").isdigit():
        import torch

        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    # A server started by `lazytrain.launch.rank_server` (a test that launched ranks in this process) blocks
    # these (`lazytrain.utils.preemption`, rule 4).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, JOB_SIGNALS)


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

"""`RankWatch`: every rank of a job learns within seconds that another rank failed or died, and stops.

Why: a collective waits for every rank. When `launch` spawned the ranks, their parent stops the others as soon
as one fails; under torchrun, SLURM or machines started by separate commands nobody does, and with NCCL a rank
blocked in an all-reduce waits for a dead peer until the process-group timeout (``launch.timeout``, hours
when it must fit a long evaluation).

How: through the job's TCP store (the rendezvous at ``MASTER_ADDR:MASTER_PORT``) and one TCP connection per
rank. A rank that raises records its rank and error under ``lazytrain/watch/failure``. Each rank listens on a
port of its own, and its watch thread holds a connection to the port of the next rank (rank + 1,
cyclically): when that process ends, killed or crashed, its kernel closes the connection at once (no Python
needs to run in it, so a rank busy in a long C call is never mistaken for a dead one); unless that rank had
marked itself done, the watcher records it as the failure. Every rank that sees a failure of another rank logs
it and ends its process with status 1 after `grace` seconds (its main thread is blocked in a collective,
which Python cannot interrupt), unless it is finishing by itself by then. If the store stops answering, the
process hosting it (rank 0, or torchrun's agent) has ended: the rank stops likewise. Errors that every rank
raised together (`lazytrain.errors.is_agreed`, e.g. a non-finite loss) are not recorded: each rank reports
them itself. A rank that hangs with its process alive is left to the collective's timeout (``launch.timeout``).
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from datetime import timedelta

from lazytrain.launch.environment import get_attempt_prefix

__all__ = ["RankWatch", "is_peer_failure"]

logger = logging.getLogger(__name__)

_PREFIX = "lazytrain/watch/"
FAILURE_KEY = _PREFIX + "failure"


def _address_key(rank: int) -> str:
    return f"{_PREFIX}address/{rank}"


def _done_key(rank: int) -> str:
    return f"{_PREFIX}done/{rank}"


class RankWatch:
    """Watch the other ranks of a job through its TCP store (a context manager around the rank's program).

    Args:
        host: the store's host (``MASTER_ADDR``).
        port: the store's port (``MASTER_PORT``).
        rank: this process's global rank.
        world_size: processes in the job.
        interval: seconds between looks at the recorded failure.
        grace: seconds between learning of another rank's failure and ending this process.
    """

    def __init__(
        self, host: str, port: int, rank: int, world_size: int, *, interval: float = 1.0, grace: float = 5.0
    ) -> None:
        self.host, self.port = host, int(port)
        self.rank, self.world_size = rank, world_size
        self.interval, self.grace = interval, grace
        self._store = None
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._death_seen = threading.Event()
        self._finishing = False
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RankWatch:
        import torch.distributed as dist

        # A client of its own: the process group's store object is not shared with a second thread.
        self._store = dist.TCPStore(
            self.host,
            self.port,
            self.world_size,
            is_master=False,
            timeout=timedelta(seconds=60),
            wait_for_workers=False,
        )
        prefix = get_attempt_prefix()  # under torchrun: this attempt's keys, not a failed attempt's
        if prefix:
            self._store = dist.PrefixStore(prefix, self._store)
        # The kernel completes connections to a listening socket without accept(), and resets them when
        # this process ends: the watcher of this rank needs nothing else from it.
        self._listener = socket.create_server(("", 0), backlog=4)
        address = f"{_get_reachable_address(self.host, self.port)}:{self._listener.getsockname()[1]}"
        self._store.set(_address_key(self.rank), address)
        self._thread = threading.Thread(target=self._run, name="lazytrain-rank-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if error is not None and isinstance(error, Exception):
            self.record_failure(error)
        self.finish()

    def record_failure(self, error: BaseException) -> None:
        """Tell every rank that this one failed (unless all ranks raised `error` together)."""
        from lazytrain.errors import is_agreed

        if is_agreed(error) or self._store is None:
            return
        if is_peer_failure(error) and not self._has_failure():
            # This rank's collective broke because a peer ended: let the watch thread name that peer first.
            self._death_seen.wait(2 * self.interval + 1)
        first_line = (str(error).strip().splitlines() or [""])[0]
        self._record(f"rank {self.rank} failed: {type(error).__name__}: {first_line}")

    def _has_failure(self) -> bool:
        try:
            return self._store.check([FAILURE_KEY])
        except Exception:
            return True  # the store is gone: nothing more to learn from it

    def _record(self, failure: str) -> None:
        try:
            if not self._store.check([FAILURE_KEY]):
                self._store.set(FAILURE_KEY, failure)
            else:
                first = self._store.get(FAILURE_KEY).decode()
                if first != failure:
                    logger.error("This rank failed after another one did: %s", first)
        except Exception as e:  # the store is gone too: the others learn it from their connections
            logger.debug("RankWatch: could not record %r: %s", failure, e)

    def finish(self) -> None:
        """This rank is done (returned or raised): tell its watcher, then stop watching."""
        self._finishing = True
        try:
            self._store.set(_done_key(self.rank), "1")
        except Exception:
            pass  # the store's host has ended: nobody is left to mistake this rank's exit for a death
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1)

    def _run(self) -> None:
        watched = (self.rank + 1) % self.world_size
        try:
            connection = self._connect(watched) if watched != self.rank else None
            while not self._stop.is_set():
                if connection is not None and _is_closed(connection, self.interval):
                    connection.close()
                    connection = None
                    if not self._store.check([_done_key(watched)]):
                        self._record(
                            f"rank {watched} died (its process ended: killed, out of memory, or crashed)"
                        )
                        self._death_seen.set()
                elif connection is None:
                    self._stop.wait(self.interval)
                if self._store.check([FAILURE_KEY]):
                    self._end_process(self._store.get(FAILURE_KEY).decode())
                    return
        except Exception as e:
            # The store lives in rank 0 (or torchrun's agent): it no longer answers, so that process ended.
            self._end_process(f"the job's store at {self.host}:{self.port} stopped answering ({e})")

    def _connect(self, rank: int) -> socket.socket:
        self._store.wait([_address_key(rank)])
        host, port = self._store.get(_address_key(rank)).decode().rsplit(":", 1)
        connection = socket.create_connection((host, int(port)), timeout=60)
        # A machine that vanishes sends nothing: keepalive probes notice it within ~30 s.
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 4)):
            if hasattr(socket, option):
                connection.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
        return connection

    def _end_process(self, failure: str) -> None:
        if self._finishing or self._stop.wait(self.grace) or self._finishing:
            return  # this rank is finishing by itself (it failed too, or the job ended normally)
        logger.error("Stopping rank %d because another rank stopped: %s", self.rank, failure)
        for handler in logging.getLogger().handlers + logging.getLogger("lazytrain").handlers:
            handler.flush()
        # The main thread waits in a collective that nothing in Python can interrupt.
        os._exit(1)


def _is_closed(connection: socket.socket, wait: float) -> bool:
    """Whether the peer closed `connection` (waits up to `wait` seconds for news; the peer never sends data)."""
    readable, _, _ = select.select([connection], [], [], wait)
    if not readable:
        return False
    try:
        return connection.recv(1) == b""
    except OSError:  # reset by the peer's kernel, or keepalive gave up
        return True


def _get_reachable_address(store_host: str, store_port: int) -> str:
    """This machine's address on the network that reaches the store (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((store_host, store_port))
            return probe.getsockname()[0]
        except OSError:
            return socket.gethostname()


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that broke because another rank's process ended."""
    import torch.distributed as dist

    text = str(error)
    return (
        isinstance(error, dist.DistError) or "Connection closed by peer" in text or "Connection reset" in text
    )

"""Fixtures for every test: no test downloads anything, and a local file server for those that need a URL."""

from __future__ import annotations

import collections
import functools
import hashlib
import http.server
import io
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch

LOCAL_HOSTS = ("127.0.0.1", "localhost")
# A proxy nobody listens on (the discard port): a subprocess that tries to download from anywhere but this
# machine gets "connection refused" at once instead of fetching (or waiting for) the internet.
_UNREACHABLE_PROXY = "http://127.0.0.1:9"


def _local_only(urlopen):
    @functools.wraps(urlopen)
    def guarded(url, *args, **kwargs):
        address = url.full_url if isinstance(url, urllib.request.Request) else str(url)
        if urllib.parse.urlparse(address).hostname not in LOCAL_HOSTS:
            raise AssertionError(
                f"a test tried to download {address}: tests download nothing. Serve a file from 127.0.0.1 "
                '(the file_server fixture), or set train.init_checkpoint="" in the test.'
            )
        return urlopen(url, *args, **kwargs)

    return guarded


@pytest.fixture(autouse=True, scope="session")
def _no_downloads(tmp_path_factory):
    """Downloads from anywhere but 127.0.0.1 fail loudly: in this process with an AssertionError naming the
    URL (urllib's and torch hub's urlopen), in subprocesses through an unreachable proxy. Torch hub's cache
    and the annotation cache are temporary folders, so no test reads or writes the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_HOME", str(tmp_path_factory.mktemp("torch_home")))
        # Annotation cache files of the suite's json data sets go to a temporary folder too, not ~/.cache.
        patch.setenv("LAZYTRAIN_CACHE", str(tmp_path_factory.mktemp("lazytrain_cache")))
        for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            patch.setenv(name, _UNREACHABLE_PROXY)
        for name in ("no_proxy", "NO_PROXY"):
            patch.setenv(name, ",".join(LOCAL_HOSTS))
        patch.setattr(urllib.request, "urlopen", _local_only(urllib.request.urlopen))
        patch.setattr(torch.hub, "urlopen", _local_only(torch.hub.urlopen))
        yield


# Files whose tests run first: the longest single tests of the suite (README's command lanes).
_FIRST = ("tests/test_readme.py",)
# Modules whose module-scoped fixtures take seconds to minutes (exports, trained runs, shared training steps):
# each runs whole on one pytest-xdist worker, so those fixtures are built once instead of once on each worker
# that gets one of the module's tests.
_ONE_WORKER = (
    "tests/conf/test_demo_resume.py",
    "tests/data/test_synthetic.py",
    "tests/engine/test_run_report.py",
    "tests/launch/test_requeue.py",
    "tests/modeling/test_export.py",
    "tests/modeling/test_export_parity.py",
    "tests/program/test_export_command.py",
    "tests/program/test_predict.py",
    "tests/scripts/test_benchmark_gpu_step.py",
    "tests/utils/test_host_syncs.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with slow tests first (README's lanes before all), each module's tests kept together (module
    fixtures are built once): with pytest-xdist handing out one test (or one module of `_ONE_WORKER`) at a
    time, the long tests start early and the quick ones fill the workers at the end, instead of a long test
    starting last while the other worker has nothing left."""
    modules_with_slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}

    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::")[0]
        return 0 if module in _FIRST else 1 if module in modules_with_slow else 2

    items.sort(key=rank)  # stable: pytest's order within each group


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """pytest-xdist's scheduler by scope, a scope being one test, or a whole module of `_ONE_WORKER`; scopes
    are handed out in collection order (``--no-loadscope-reorder``, pyproject.toml). xdist's own
    ``--dist loadgroup`` would do this with marks, but its test-id suffix has no effect under pytest 9.2."""
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return module if module in _ONE_WORKER else nodeid

    return OneWorkerModules(config, log)


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests[self.path] += 1
        time.sleep(self.server.delay)
        super().do_GET()

    def log_message(self, format, *args) -> None:  # keeps test output to the test's own lines
        pass


class FileServer:
    """Files under `root` served at ``http://127.0.0.1:<port>/<name>``; `requests` counts GETs per path and
    `delay` (seconds) holds each response back, so a download can be caught while it runs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_CountingHandler, directory=str(root))
        )
        self._server.lock = threading.Lock()
        self._server.requests = collections.Counter()
        self._server.delay = 0.0
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def requests(self) -> collections.Counter:
        return self._server.requests

    @property
    def delay(self) -> float:
        return self._server.delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        self._server.delay = seconds

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{name}"

    def add_weights(self, state: dict, stem: str) -> str:
        """Serve ``torch.save(state)`` as ``<stem>-<its sha256 prefix>.pth`` (torch hub's naming); its URL."""
        buffer = io.BytesIO()
        torch.save(state, buffer)
        data = buffer.getvalue()
        name = f"{stem}-{hashlib.sha256(data).hexdigest()[:8]}.pth"
        (self.root / name).write_bytes(data)
        return self.url(name)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def file_server(tmp_path):
    """A `FileServer` on 127.0.0.1 serving a fresh temporary folder."""
    root = tmp_path / "served"
    root.mkdir()
    server = FileServer(root)
    yield server
    server.close()


@pytest.fixture
def one_thread():
    """torch on one thread for the test: on the shared 2-core machine, two OpenMP threads competing with other
    jobs made model steps many times slower (a ResNet-18 forward 30x) through busy-waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

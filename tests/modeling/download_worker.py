"""Run by tests/modeling/test_download.py as two processes at once, as two ranks of one machine would be.

``python -m tests.modeling.download_worker URL GO_FILE``: prints ``ready`` once imports are done, waits for
GO_FILE to exist (so both processes ask at the same moment), downloads, prints the local path. The log goes
to stderr.
"""

import logging
import os
import sys
import time

from lazytrain.modeling.download import download_to_cache


def main(url: str, go_file: str) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
    print("ready", flush=True)
    while not os.path.exists(go_file):
        time.sleep(0.005)
    print(download_to_cache(url), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

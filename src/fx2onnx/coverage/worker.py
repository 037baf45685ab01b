"""The worker process of the coverage pool: ``python -m fx2onnx.coverage.worker READ_FD WRITE_FD``.

It receives cases (as dicts) on one pipe and sends back, on the other, ``("phase", ...)`` as it moves
through a sample, ``("sample", ...)`` after each sample and ``("done", record)`` at the end (and ``("ready", None)``
once, when its imports are done); ``None``
asks it to exit.
"""

from __future__ import annotations

import multiprocessing.connection
import sys
import warnings
from typing import Any


def main(read_fd: int, write_fd: int) -> None:
    receiver = multiprocessing.connection.Connection(read_fd, writable=False)
    sender = multiprocessing.connection.Connection(write_fd, readable=False)
    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)  # workers share the machine's cores with each other
    from fx2onnx.coverage.cases import Case, op_database
    from fx2onnx.coverage.runner import run_case

    op_database()

    def emit(kind: str, payload: Any) -> None:
        sender.send((kind, payload))

    emit("ready", None)

    while True:
        try:
            message = receiver.recv()
        except EOFError:
            return
        if message is None:
            return
        emit("done", run_case(Case(**message), emit))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))

"""Where a sweep's points run: inline, in local worker processes (each receives the trace once, through the
pool's initializer), or as Ray tasks on an existing cluster (the trace put in the object store once)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from minipaged_cli.apps.sweep_points import Point, Work, run_point
from minipaged_cli.errors import InputError

_COST_RANK = {"paged": 0, "dynamic": 1}  # the rest after these

_WORK: list[Work] = []  # a worker process's Work, set once by the pool's initializer


def _init_worker(work: Work) -> None:
    _WORK[:] = [work]


def _run_in_worker(point: Point) -> dict[str, Any]:
    return run_point(_WORK[0], point)


class LocalRunner:
    """Inline (``workers`` 1) or in a pool of worker processes that each receive the Work (the trace) once."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.pool: ProcessPoolExecutor | None = None

    def describe(self) -> str:
        return f"{self.workers} local worker process{'es' if self.workers > 1 else ''}" if self.workers > 1 \
            else "this process"

    def start(self, work: Work) -> None:
        self.work = work
        if self.workers > 1:
            self.pool = ProcessPoolExecutor(self.workers, initializer=_init_worker, initargs=(work,))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def run(self, points: list[Point]) -> Iterator[tuple[Point, dict[str, Any]]]:
        if self.pool is None:
            for point in points:
                yield point, run_point(self.work, point)
            return
        # The longest replays first, so that the last to finish are short ones: paging and dynamic extents do the
        # most bookkeeping, and a lower rate spreads the same requests over more, smaller steps.
        ordered = sorted(points, key=lambda p: (_COST_RANK.get(p.strategy, 0), p.rate))
        pending: dict[Future[dict[str, Any]], Point] = {self.pool.submit(_run_in_worker, p): p for p in ordered}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield pending.pop(future), future.result()


class RayRunner:
    """Ray tasks on an existing cluster: the Work goes into the object store once, and this package's code
    travels with the job (``runtime_env`` ``py_modules``), so the cluster needs only Ray and the dependencies."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ray = ray = import_ray()
        check_reachable(address)
        if not ray.is_initialized():
            import minipaged_cli

            try:
                ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                         runtime_env={"py_modules": [minipaged_cli]})
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise InputError(f"cannot connect to a Ray cluster: {str(error).splitlines()[0]}", field="--ray",
                                 value=address, has_value=True) from None

    def describe(self) -> str:
        return f"Ray at {self.address}"

    def start(self, work: Work) -> None:
        self.shared = self.ray.put(work)
        self.task = self.ray.remote(run_point)

    def close(self) -> None:
        pass  # the cluster is not ours: stay connected for a caller who runs more

    def run(self, points: list[Point]) -> Iterator[tuple[Point, dict[str, Any]]]:
        # Ray resolves the shared reference to the Work before each call.
        pending = {self.task.remote(self.shared, p): p for p in points}
        while pending:
            done, _ = self.ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), self.ray.get(ref)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("Ray is not installed: pip install -e \".[ray]\"", field="--ray") from None
    return ray


def check_reachable(address: str) -> None:
    """A HOST:PORT that answers, before Ray spends a minute retrying one that does not."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError("expected HOST:PORT of a Ray head node (or auto)", field="--ray", value=address,
                         has_value=True)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as error:
        raise InputError(f"cannot reach a Ray cluster there: {error.strerror or error}", field="--ray",
                         value=address, has_value=True) from None



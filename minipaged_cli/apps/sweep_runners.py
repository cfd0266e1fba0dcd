"""Where a sweep's replays run: inline, in local worker processes (each receives the trace once, through the
pool's initializer), or as Ray tasks (the trace put in the object store once)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from minipaged_cli.apps.sweep_points import Replay, Work, run_replay
from minipaged_cli.errors import InputError
from minipaged_cli.extras import needs

# Strategies by the bookkeeping a replay does, most first: paging and dynamic extents; the reservations after.
_COST_RANK = {"paged": 0, "dynamic": 1}

_WORK: list[Work] = []  # a worker process's Work, set once by the pool's initializer


def _init_worker(work: Work) -> None:
    _WORK[:] = [work]


def _run_in_worker(job: Replay) -> dict[str, Any]:
    return run_replay(_WORK[0], job)


def longest_first(jobs: list[Replay]) -> list[Replay]:
    """The longest replays first, so that the last to finish are short ones: a strategy that does more
    bookkeeping, and a lower rate, which spreads the same requests over more, smaller steps."""
    return sorted(jobs, key=lambda job: (_COST_RANK.get(job.point.strategy, len(_COST_RANK)), job.point.rate))


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

    def run(self, jobs: list[Replay]) -> Iterator[tuple[Replay, dict[str, Any]]]:
        if self.pool is None:
            for job in jobs:
                yield job, run_replay(self.work, job)
            return
        pending: dict[Future[dict[str, Any]], Replay] = {self.pool.submit(_run_in_worker, job): job
                                                         for job in longest_first(jobs)}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                yield pending.pop(future), future.result()


class RayRunner:
    """Ray tasks: the Work goes into the object store once, and this package's code travels with the job
    (``runtime_env`` ``py_modules``), so a cluster needs only Ray and the dependencies.

    ``address`` "auto" joins the cluster RAY_ADDRESS names or the one started on this machine, and when there is
    none starts a local cluster for this sweep, as ``ray.init()`` does ("local" always does): ``started``, shut
    down at ``close``. Ray 2.60 starts clusters with token authentication (the token in ~/.ray/auth_token) and
    sends the token only to a cluster it found on its own, so to a HOST:PORT given here the sweep sends the token
    found on this machine too (``_use_token``).
    """

    def __init__(self, address: str) -> None:
        self.address = address
        self.ray = import_ray()
        self.started = False
        self.description = f"Ray at {address}"
        check_reachable(address)
        if self.ray.is_initialized():
            return
        import minipaged_cli

        options = {"log_to_driver": False, "logging_level": "ERROR", "runtime_env": {"py_modules": [minipaged_cli]}}
        try:
            if address == "auto":
                try:
                    self.ray.init(address="auto", **options)
                except ConnectionError:  # no cluster to join
                    self._start_local(options)
            elif address == "local":
                self._start_local(options)
            else:
                _use_token()
                self.ray.init(address=address, **options)
        except (ConnectionError, RuntimeError, ValueError) as error:
            hint = (" (a cluster with token authentication needs its token here: RAY_AUTH_TOKEN or "
                    "~/.ray/auth_token)") if isinstance(error, ConnectionError) else ""
            raise InputError(f"cannot connect to a Ray cluster: {str(error).splitlines()[0]}{hint}", field="{ray}",
                             value=address, has_value=True) from None

    def _start_local(self, options: dict[str, Any]) -> None:
        self.ray.init(include_dashboard=False, **options)
        self.started = True
        cpus = int(self.ray.cluster_resources().get("CPU", 0))
        self.description = f"a local Ray cluster ({cpus} CPUs), started for this sweep"

    def describe(self) -> str:
        return self.description

    def start(self, work: Work) -> None:
        self.shared = self.ray.put(work)
        self.task = self.ray.remote(run_replay)

    def close(self) -> None:
        # A cluster found running is not ours: stay connected for a caller who runs more. One we started goes.
        if self.started:
            self.ray.shutdown()

    def run(self, jobs: list[Replay]) -> Iterator[tuple[Replay, dict[str, Any]]]:
        # Ray resolves the shared reference to the Work before each call.
        pending = {self.task.remote(self.shared, job): job for job in jobs}
        while pending:
            done, _ = self.ray.wait(list(pending), num_returns=1)
            for ref in done:
                yield pending.pop(ref), self.ray.get(ref)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError(needs("ray"), field="{ray}") from None
    return ray


def _use_token() -> None:
    """Send a cluster named by its address the token found on this machine (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or
    ~/.ray/auth_token), as Ray does for a cluster it finds itself; RAY_AUTH_MODE, when set, decides instead. A
    cluster without token authentication ignores it; one with it refuses a client without it."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray from before token authentication
        return
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def check_reachable(address: str) -> None:
    """A HOST:PORT that answers, before Ray spends a minute retrying one that does not."""
    if address in ("auto", "local") or address.startswith("ray://"):
        return
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError("expected HOST:PORT of a Ray head node (or auto)", field="{ray}", value=address,
                         has_value=True)
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as error:
        raise InputError(f"cannot reach a Ray cluster there: {error.strerror or error}", field="{ray}",
                         value=address, has_value=True) from None



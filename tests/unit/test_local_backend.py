"""The local backend's restart policy, on a fake clock with fake worker processes: a
worker that had connected is restarted at once however often it dies; a start-up crash
loop backs off 0.1 s doubling to the cap, and the back-off resets after a quiet spell."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from sloline.backends.local import LocalBackend, RestartPolicy, StageLaunch, _Replica, _Stage
from sloline.spec import DEFAULT_CATALOG


class FakeProcess:
    pids = itertools.count(100)

    def __init__(self) -> None:
        self.pid = next(self.pids)
        self.code: int | None = None

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, _signal: int) -> None:
        self.code = 0


class Backend(LocalBackend):
    """Spawns fake processes; `crash` makes one exit as a real worker would."""

    def __init__(self, tmp: Path, replicas: int = 1) -> None:
        self.now = 0.0
        hardware = DEFAULT_CATALOG.get("cpu-1")
        super().__init__(
            tmp / "pipeline.yaml",
            "127.0.0.1:1",
            [StageLaunch("s", hardware, replicas)],
            log_dir=tmp,
            clock=lambda: self.now,
        )
        self.spawned = 0

    def _spawn(self, stage: _Stage) -> None:
        self.spawned += 1
        log = self.log_dir / f"s-{self.spawned}.log"
        log.write_text("loading\n")
        stage.replicas.append(_Replica(FakeProcess(), self.now, log))  # type: ignore[arg-type]

    def live(self) -> list[_Replica]:
        return self._stages["s"].replicas

    def crash(self, *, connected: bool) -> None:
        replica = self.live()[0]
        if connected:
            self.worker_connected(replica.process.pid)
        with replica.log_path.open("a") as f:
            f.write("Traceback: boom\n")
        replica.process.code = 1  # type: ignore[attr-defined]

    def step(self, dt: float = 0.0) -> None:
        """One turn of the watch loop, `dt` seconds later."""
        self.now += dt
        self._reap()
        self._reconcile()

    def wait_for_restart(self, step_s: float = 0.01) -> float:
        """Seconds from the crash until the stage has all its workers again."""
        self.step()  # the crash is seen
        waited = 0.0
        while len(self.live()) < self._stages["s"].desired:
            self.step(step_s)
            waited += step_s
        return round(waited, 2)


def test_policy_delays() -> None:
    policy = RestartPolicy()
    assert [policy.delay(n) for n in range(1, 9)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]


def test_a_worker_that_served_is_restarted_at_once_every_time(tmp_path: Path) -> None:
    b = Backend(tmp_path)
    b._reconcile()
    for n in range(1, 21):
        b.crash(connected=True)
        assert b.wait_for_restart() == 0.0, f"crash {n}: not restarted at once"
        b.now += 0.05
    status = b.status()["s"]
    assert status.restarts == 20 and status.running == 1
    assert status.last_error.startswith("worker pid ") and "exited with 1: " in status.last_error
    assert "Traceback: boom" in status.last_error and "restart in" not in status.last_error


def test_a_start_up_crash_loop_backs_off_to_the_cap(tmp_path: Path) -> None:
    b = Backend(tmp_path, replicas=2)
    b._reconcile()
    waits = []
    for _ in range(9):
        b.crash(connected=False)
        waits.append(b.wait_for_restart())
    # The other replica keeps the stage up; never more than the cap before a restart.
    assert waits == pytest.approx([0.0, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0], abs=0.011)
    assert "crash 9 in a row before it connected: restart in 2.0 s" in b.status()["s"].last_error
    b.now += 10.0  # a quiet spell: the next crash restarts at once again
    b.crash(connected=False)
    assert b.wait_for_restart() == 0.0
    b.crash(connected=False)
    assert b.wait_for_restart() == pytest.approx(0.1, abs=0.011)


def test_a_worker_that_connected_ends_a_crash_loop(tmp_path: Path) -> None:
    b = Backend(tmp_path)
    b._reconcile()
    for _ in range(5):
        b.crash(connected=False)
        b.wait_for_restart()
    b.crash(connected=True)
    assert b.wait_for_restart() == 0.0


def test_stopped_and_outgoing_workers_are_not_restarted(tmp_path: Path) -> None:
    b = Backend(tmp_path, replicas=2)
    b._reconcile()
    b.scale("s", 1)
    b.step(0.1)
    assert len(b.live()) == 1 and b.status()["s"].restarts == 0

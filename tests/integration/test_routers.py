"""Many routers per pipeline on the real embedded stack (`sloline run --routers N`):
router processes share the client ports, every worker serves every router, a router
killed with -9 costs only the requests it held and is replaced, and router 0's
envelope counts every router's arrivals."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from sloline.serving.stats import Ring
from tests.support.load import KeepAliveLoad
from tests.support.net import free_port
from tests.support.serve import NOOP, BackgroundPipeline, run_routers

BODY = json.dumps(
    {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}
).encode()


@dataclass
class Outcome:
    start: float
    end: float
    ok: bool
    error: str = ""


def infer(url: str) -> Outcome:
    """One request on a connection of its own (the kernel picks a router per connection)."""
    start = time.monotonic()
    request = urllib.request.Request(
        f"http://{url}/v2/models/noop/infer",
        data=BODY,
        headers={"Content-Type": "application/json", "Connection": "close"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            ok = response.status == 200 and json.loads(response.read())["outputs"]
            return Outcome(start, time.monotonic(), bool(ok))
    except (urllib.error.URLError, ConnectionError, OSError) as exc:
        return Outcome(start, time.monotonic(), False, repr(exc))


def listeners(port: int) -> int:
    """Listening sockets on `port` (one per router sharing it)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                count += 1
    return count


def closed_at(port: int, before: int) -> float:
    """When a router's listening socket on `port` is gone (the kernel then sends new
    connections to the others)."""
    while listeners(port) >= before:
        time.sleep(0.0005)
    return time.monotonic()


def requests_served(metrics_url: str) -> float:
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith('sloline_requests_total{code="200"'):
                return float(line.split()[-1])
    return 0.0


def credit_grants(metrics_url: str) -> float:
    """Credits granted to this router by workers that serve several routers."""
    with urllib.request.urlopen(f"http://{metrics_url}/metrics", timeout=5) as r:
        return sum(
            float(line.split()[-1])
            for line in r.read().decode().splitlines()
            if line.startswith("sloline_stage_credit_messages_total{") and 'kind="grant"' in line
        )


def scrape(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return bytes(r.read())
    except OSError:
        return b""


def wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    logs = tmp_path_factory.mktemp("logs")
    with BackgroundPipeline(NOOP, routers=3, log_dir=logs) as pipeline:
        yield pipeline


def test_every_router_serves_and_router_0_counts_all_arrivals(served: BackgroundPipeline) -> None:
    p = served.p
    assert len(p.extra_routers) == 2
    ring = Ring(1 << 12)

    def install() -> None:
        p.router.stats.arrivals = ring

    served.loop.call_soon_threadsafe(install)
    time.sleep(0.1)
    outcomes = [infer(p.http_url) for _ in range(90)]
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    counts = [requests_served(p.metrics_url)] + [
        requests_served(r.metrics_url) for r in p.extra_routers
    ]
    assert sum(counts) >= 90
    assert all(c > 0 for c in counts), counts  # the kernel spread connections over all three
    # One worker per stage holds its one credit at one router at a time (the first it
    # greeted): serving all three routers took at least two grants per stage, each counted
    # by the router that received it.
    urls = [p.metrics_url] + [r.metrics_url for r in p.extra_routers]
    assert sum(map(credit_grants, urls)) >= 2 * 3
    # The other routers' arrivals reach router 0 within a flush interval.
    wait_for(lambda: len(ring.since(0.0)) >= 90, "router 0 to count every arrival", 5.0)

    def remove() -> None:
        p.router.stats.arrivals = None

    served.loop.call_soon_threadsafe(remove)


def test_kill_9_of_a_router_fails_only_its_requests_and_it_is_replaced(
    served: BackgroundPipeline,
) -> None:
    p = served.p
    assert p.backend is not None
    victim = p.extra_routers[0]
    old_pid = p.backend.router_pids()[victim.name]
    outcomes: list[Outcome] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            outcomes.append(infer(p.http_url))

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    port = int(p.http_url.rsplit(":", 1)[1])
    sockets = listeners(port)
    assert sockets == 3
    os.kill(old_pid, signal.SIGKILL)
    killed_at = closed_at(port, sockets)  # from then on new connections go elsewhere
    time.sleep(3.0)
    stop.set()
    for thread in threads:
        thread.join(30)
    before = [o for o in outcomes if o.start < killed_at]
    after = [o for o in outcomes if o.start >= killed_at]
    failed = [o for o in outcomes if not o.ok]
    # Only requests in flight at the kill fail: one per load thread at most, each begun
    # before the kill (its connection was the dead router's).
    assert len(failed) <= len(threads), [o.error for o in failed]
    timing = [(o.start - killed_at, o.end - killed_at, o.error) for o in failed]
    assert all(o.start < killed_at and o.end >= killed_at - 0.5 for o in failed), timing
    assert sum(o.ok for o in before) > 0
    # New requests reach the survivors at once: every one begun after the kill succeeds.
    assert after and all(o.ok for o in after)
    first_after = min(o.end for o in after) - killed_at
    print(
        f"kill -9 of {victim.name}: {len(failed)} request(s) failed of {len(before)} begun "
        f"before it; first success begun after it ended {first_after * 1000:.0f} ms later"
    )
    assert first_after < 1.0 or len(after) > 10  # generous: a loaded machine is slow
    # The local backend starts another; every worker connects to it again.
    wait_for(
        lambda: p.backend.router_pids().get(victim.name, old_pid) != old_pid,  # type: ignore[union-attr]
        "the router to be replaced",
        30.0,
    )
    stages = set(p.router.queues)
    wait_for(
        lambda: {s for s, n in victim.ready_replicas().items() if n >= 1} == stages,
        "the workers to reconnect to the new router",
        30.0,
    )
    restarts, last_exit = p.backend.router_status()[victim.name]
    assert restarts == 1 and "-9" in last_exit
    # It serves: connections land on it again.
    served_before = requests_served(victim.metrics_url)
    outcomes = [infer(p.http_url) for _ in range(60)]
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    assert requests_served(victim.metrics_url) > served_before


def noop_answer(body: bytes) -> bool:
    return bool(json.loads(body)["outputs"])


def test_sigterm_to_each_other_router_in_turn_under_load_fails_no_request(
    served: BackgroundPipeline,
) -> None:
    """Routers 1..N-1 restarted one after the other with SIGTERM (router 0 is `sloline run`
    itself) while keep-alive clients that never retry send steady load: each drains
    (answers with `Connection: close`, its clients reconnect to the others), exits, and
    the local backend starts a new one that the workers join; no request fails."""
    p = served.p
    assert p.backend is not None
    host, port = p.http_url.rsplit(":", 1)
    stages = set(p.router.queues)
    body = json.dumps({**json.loads(BODY), "parameters": {"timeout_ms": 30_000}}).encode()
    with KeepAliveLoad(
        (host, int(port)), "/v2/models/noop/infer", body, noop_answer, connections=8, period_s=0.05
    ) as load:
        time.sleep(1.0)
        for victim in p.extra_routers:
            old_pid = p.backend.router_pids()[victim.name]
            os.kill(old_pid, signal.SIGTERM)
            wait_for(
                lambda v=victim, o=old_pid: p.backend.router_pids().get(v.name, o) != o,  # type: ignore[union-attr]
                f"{victim.name} replaced",
                30.0,
            )
            wait_for(
                lambda v=victim: {s for s, n in v.ready_replicas().items() if n >= 1} == stages,
                f"the workers to join the new {victim.name}",
                30.0,
            )
        time.sleep(1.0)
    print(
        f"SIGTERM to {len(p.extra_routers)} of 3 routers in turn: {load.ok} ok / "
        f"{len(load.failures)} failed ({load.closes} answers with Connection: close)"
    )
    assert not load.failures, load.failures[:10]
    assert load.closes > 0  # the drained routers had clients, who moved


def test_run_routers_flag_is_checked() -> None:
    from sloline.cli.parser import build_parser
    from sloline.spec import PipelineError

    args = build_parser().parse_args(["run", str(NOOP), "--routers", "0", "--no-plan"])
    with pytest.raises(PipelineError, match="--routers"):
        args.func(args)


def test_run_prints_every_routers_metrics_and_leaves_no_orphans() -> None:
    """`sloline run --routers 2`: the banner names both routers' /metrics (each answers),
    and a crash of `sloline run` takes the other router and the workers with it."""
    http_port, grpc_port = free_port(), free_port()
    process, urls = run_routers("--port", str(http_port), "--grpc-port", str(grpc_port),
                                "--no-plan", "--routers", "2",
                                "--status-interval", "0")  # fmt: skip
    try:
        assert len(urls) == 2 and not any(f":{http_port}/" in u for u in urls), urls
        for url in urls:  # router 1 may still be starting
            wait_for(lambda u=url: b"sloline_requests_total" in scrape(u), f"{url} to answer")
        children = psutil.Process(process.pid).children(recursive=True)
        assert sum("embedded-router" in c.cmdline() for c in children) == 1
        assert sum("worker" in c.cmdline() for c in children) == 3
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)
    deadline = time.monotonic() + 15
    while any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children):
        assert time.monotonic() < deadline, "processes outlived a crashed sloline run"
        time.sleep(0.05)

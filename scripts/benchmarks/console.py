"""The run console's list (`GET /v1/runs`) over a large history: one page, p95.

BENCH_CONSOLE_RUNS finished runs (1,000,000) are written straight into a throwaway database
with generate_series, all in one tenant (the worst case: its index range holds them all),
over three agents, one in fifty failed, a second apart. Then, through the real HTTP server
and a viewer's token, BENCH_CONSOLE_N requests (200) of each kind: the newest page; a page
far back (the cursor of the 1,000th page of 50); a status filter (failed); an agent filter;
a day's time range; one idempotency key. Baseline, in the same run: `GET /v1/runs/{id}`, one
run by its primary key through the same stack. Target: each page ≤ 50 ms p95. The counts by
status (counts=true) read every matching entry and are reported beside, not targeted.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from ledgerloop.approvals.principals import principal_create
from ledgerloop.config import DEFAULT_TENANT
from ledgerloop.db.connect import connect
from ledgerloop.http.app import create_app
from ledgerloop.http.server import listen, run_server
from scripts.benchmarks import results
from scripts.benchmarks.common import database, report

# A smoke run still pages 1,000 pages of 50 deep, so it needs 50,000 runs and more.
RUNS = int(results.size("BENCH_CONSOLE_RUNS", "1000000", "60000"))
N = int(results.size("BENCH_CONSOLE_N", "200", "5"))
TARGET_MS = 50.0

FILL = """
INSERT INTO ledgerloop.agent_run
  (id, tenant_id, agent, status, state, input, idempotency_key, version, created_at, updated_at)
SELECT gen_random_uuid(), %(tenant)s,
       (ARRAY['ops', 'triage', 'billing'])[1 + g %% 3],
       CASE WHEN g %% 50 = 0 THEN 'failed' ELSE 'succeeded' END,
       '{"turns": 3}'::jsonb, jsonb_build_object('message', 'run ' || g),
       'key-' || g, 6,
       now() - make_interval(secs => g), now() - make_interval(secs => g) + interval '4 s'
FROM generate_series(%(start)s::int, %(stop)s::int) AS g
"""


def _fill(url: str) -> float:
    started = time.perf_counter()
    with connect(url, autocommit=True) as conn:
        for start in range(1, RUNS + 1, 250_000):  # in slices: one huge statement spills
            stop = min(start + 249_999, RUNS)
            conn.execute(FILL, {"tenant": DEFAULT_TENANT, "start": start, "stop": stop})
        conn.execute("VACUUM ANALYZE ledgerloop.agent_run")
    return time.perf_counter() - started


@contextmanager
def _serving(url: str) -> Iterator[str]:
    app = create_app(url, agent_names={"ops", "triage", "billing"})
    sock = listen("127.0.0.1", 0)
    stop: asyncio.Event | None = None
    loop: asyncio.AbstractEventLoop | None = None
    ready = threading.Event()

    async def main() -> None:
        nonlocal stop, loop
        loop, stop = asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        await run_server(app, sock, stop)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    ready.wait(30)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    try:
        yield base
    finally:
        assert loop is not None
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def _p95_ms(client: httpx.Client, path: str, params: dict[str, str] | None = None) -> float:
    times = []
    for _ in range(N):
        started = time.perf_counter()
        response = client.get(path, params=params)
        times.append((time.perf_counter() - started) * 1000)
        response.raise_for_status()
    return statistics.quantiles(times, n=20)[-1]


def main() -> None:
    with database() as url:
        fill_s = _fill(url)
        with connect(url, autocommit=True) as conn:
            _, token = principal_create(conn, name="bench@example.com", roles=["viewer"])
            row = conn.execute(
                "SELECT id FROM ledgerloop.agent_run ORDER BY created_at DESC LIMIT 1 OFFSET 5000"
            ).fetchone()
            assert row is not None
            one_run = row["id"]
        with (
            _serving(url) as base,
            httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60
            ) as client,
        ):
            # The cursor of the 1,000th page, found by paging there the way a client would.
            far: dict[str, str] = {"limit": "50"}
            for _ in range(999):
                far["cursor"] = client.get("/v1/runs", params=far).json()["next_cursor"]
            first = client.get("/v1/runs", params={"limit": "1"}).json()["runs"][0]
            day_end = first["created_at"]
            day_start = client.get(
                "/v1/runs", params={"cursor": far["cursor"], "limit": "1"}
            ).json()["runs"][0]["created_at"]
            baseline = _p95_ms(client, f"/v1/runs/{one_run}")
            cases = {
                "newest page (50)": {"limit": "50"},
                "page 1,000 by cursor": far,
                "status=failed": {"status": "failed", "limit": "50"},
                "agent=billing": {"agent": "billing", "limit": "50"},
                "time range": {"created_after": day_start, "created_before": day_end},
                "idempotency_key": {"idempotency_key": "key-777777"},
            }
            rows = [("GET /v1/runs/{id} (baseline)", baseline, "ms p95")]
            for name, params in cases.items():
                p95 = _p95_ms(client, "/v1/runs", params)
                verdict = "ok" if p95 <= TARGET_MS else f"OVER the {TARGET_MS:.0f} ms target"
                rows.append((name, p95, f"ms p95, {p95 / baseline:.2f}x baseline, {verdict}"))
            started = time.perf_counter()
            counts = client.get("/v1/runs", params={"counts": "true", "limit": "1"}).json()
            rows.append(
                ("counts=true (once)", (time.perf_counter() - started) * 1000, "ms, not targeted")
            )
            assert sum(counts["counts"].values()) == RUNS, counts["counts"]
        report(
            f"GET /v1/runs over {RUNS:,} finished runs ({N} requests each; filled in "
            f"{fill_s:.0f} s)",
            rows,
        )
    results.publish(
        "console", __doc__, results.Baseline("GET /v1/runs/{id}, same stack", baseline, "ms p95")
    )


if __name__ == "__main__":
    main()

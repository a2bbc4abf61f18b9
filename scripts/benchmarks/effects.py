"""The act step and the relay.

1. Act step end to end (effect + outbox in one transaction, relay delivery, the workflow
   hearing back) against a bare DBOS step making the same HTTP call to the same ticket
   service: both include the downstream's time, so the ratio is the framework's cost.
   Target: <= 3x.
2. Relay throughput: N effects committed at once, delivered to the ticket service (its own
   process). Target: >= 1,000 deliveries/s.
3. Commit -> delivery latency with an idle relay, one effect at a time. Target: p50 <= 20 ms.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx
from dbos import DBOS

from ledgerloop.agent import write_steps
from ledgerloop.db.connect import connect
from ledgerloop.effects.ledger import effect_begin
from ledgerloop.effects.messages import DeliveryRequest
from ledgerloop.effects.relay import RelayConfig
from ledgerloop.effects.testing import RelayThread, act_event
from ledgerloop.runs.start import start_run
from ledgerloop.runtime import Runtime
from ledgerloop.services import relay_service
from ledgerloop.testing.postgres import wait_until
from scripts.benchmarks.common import (
    database,
    per_unit_ms,
    policy_file,
    report,
    run_in_worker,
    scripted,
    settings_for,
    timed,
    wait_http,
)
from scripts.benchmarks.results import Baseline, publish, size

ACTS = int(size("BENCH_EFFECTS_ACTS", "15", "2"))
ROUNDS = int(size("BENCH_EFFECTS_ROUNDS", "8", "1"))
THROUGHPUT_N = int(size("BENCH_RELAY_N", "3000", "20"))
LATENCY_N = int(size("BENCH_EFFECTS_LATENCY_N", "40", "3"))


def ticket_service() -> tuple[subprocess.Popen[bytes], str]:
    from ledgerloop.db.cluster import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledgerloop.examples.ticket_service", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/healthz", proc)
    return proc, url


TICKETS_URL = ""
_CLIENT: httpx.AsyncClient | None = None


async def _bare_post() -> Any:
    # One keep-alive client, as the relay has: the baseline must not pay for connection set-up.
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = httpx.AsyncClient()
    client = _CLIENT
    if True:
        response = await client.post(
            f"{TICKETS_URL}/idempotent/tickets",
            json={"title": "bench", "body": "", "priority": "normal"},
            headers={"Idempotency-Key": str(uuid.uuid4())},
        )
        return response.json()


@DBOS.workflow(name="bench_bare_post")
async def bench_bare_post(n: int) -> None:
    for i in range(n):
        await DBOS.run_step_async({"name": f"post-{i}"}, _bare_post)


@DBOS.workflow(name="bench_act")
async def bench_act(run_id: str, tenant: str, n: int) -> None:
    for i in range(n):
        call = {"id": f"toolu_{i}", "name": "write_ticket", "input": {"title": f"t{i}"}}
        name = f"tool-{i}-{call['id']}"
        recorded = await DBOS.run_step_async(
            {"name": name},
            write_steps.record_effect,
            run_id,
            tenant,
            name,
            "ops",
            "write_ticket",
            call,
            None,
        )
        # As the agent loop does: a quick outcome comes back with the step, else it waits.
        while "outcome" not in recorded:
            message = await DBOS.recv_async(recorded["key"], 30)
            if message is None or message["status"] in ("succeeded", "failed"):
                break


async def measure_act(runtime: Runtime) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"bare": [], "act": []}
    for r in range(ROUNDS + 1):
        with runtime.pool.connection() as conn:
            conn.autocommit = True
            run_id = start_run(conn, agent="ops", input={"message": "bench"})
            # The run only owns the effects: take its queued workflow out of the queue and
            # let the benchmark workflow below use its id.
            conn.execute(
                "DELETE FROM dbos.workflow_status WHERE workflow_uuid = %s", (str(run_id),)
            )
            conn.execute(
                "UPDATE ledgerloop.agent_run SET status = 'planning' WHERE id = %s", (run_id,)
            )
        tenant = str(uuid.UUID(int=0))
        from dbos import SetWorkflowID

        t_bare = await timed(lambda: bench_bare_post(ACTS))

        async def act() -> None:
            with SetWorkflowID(str(run_id)):  # noqa: B023
                await bench_act(str(run_id), tenant, ACTS)  # noqa: B023

        t_act = await timed(act)
        if r:
            samples["bare"].append(t_bare)
            samples["act"].append(t_act)
    return {k: per_unit_ms(v, ACTS) for k, v in samples.items()}


def _pending_effects(url: str, n: int) -> list[str]:
    """n runs (with their workflow rows, so messages have a destination) and one effect each."""
    keys = []
    with connect(url, autocommit=True) as conn, conn.transaction():
        for i in range(n):
            run_id = start_run(conn, agent="ops", input={"message": f"r{i}"})
            key = f"{run_id}:toolu_bench"
            act_event(conn, run_id, key, call_id="toolu_bench")
            effect_begin(
                conn,
                key=key,
                run_id=run_id,
                tenant_id=uuid.UUID(int=0),
                tool="write_ticket",
                request_hash=key,
                destination="tickets",
                request=DeliveryRequest(
                    path="/idempotent/tickets",
                    body={"title": "bench", "body": "", "priority": "normal"},
                    honours_idempotency=True,
                ),
            )
            keys.append(key)
    return keys


def measure_relay(url: str) -> dict[str, float]:
    keys = _pending_effects(url, THROUGHPUT_N)
    done_sql = "SELECT count(*) AS n FROM ledgerloop.activity_effect WHERE status = 'succeeded'"
    with connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        with RelayThread(url, {"tickets": TICKETS_URL}, RelayConfig()):
            wait_until(
                lambda: conn.execute(done_sql).fetchone()["n"] >= len(keys),  # type: ignore[index]
                timeout=600,
                interval=0.01,
            )
            elapsed = time.perf_counter() - start
            # Latency: one effect at a time into an idle relay.
            latencies = []
            for i in range(LATENCY_N):
                run_id = start_run(conn, agent="ops", input={"message": f"l{i}"})
                key = f"{run_id}:toolu_lat"
                act_event(conn, run_id, key, call_id="toolu_lat")
                t0 = time.perf_counter()
                effect_begin(
                    conn,
                    key=key,
                    run_id=run_id,
                    tenant_id=uuid.UUID(int=0),
                    tool="write_ticket",
                    request_hash=key,
                    destination="tickets",
                    request=DeliveryRequest(
                        path="/idempotent/tickets",
                        body={"title": "lat", "body": "", "priority": "normal"},
                        honours_idempotency=True,
                    ),
                )
                wait_until(
                    lambda: conn.execute(
                        "SELECT 1 FROM ledgerloop.activity_effect "
                        "WHERE idempotency_key = %s AND status = 'succeeded'",
                        (key,),  # noqa: B023
                    ).fetchone(),
                    timeout=30,
                    interval=0.0005,
                )
                latencies.append((time.perf_counter() - t0) * 1000)
    # The queued workflows of these runs never run: no worker is started in this part.
    return {
        "rate": len(keys) / elapsed,
        "p50": statistics.median(latencies),
        "p95": sorted(latencies)[int(len(latencies) * 0.95) - 1],
    }


#: The act step refuses a write its policy wants approved and that was not: the benchmark
#: measures the effect protocol, so its write_ticket needs no approval.
POLICY = """
version: "bench"
tools:
  write_ticket: {requires_approval: false, timeout_ms: 8000}
destinations:
  tickets: http://127.0.0.1:9
"""


def main() -> None:
    global TICKETS_URL
    proc, TICKETS_URL = ticket_service()
    try:
        script = "default: {turns: [{text: done}]}"
        with (
            database() as url,
            scripted(script) as model,
            policy_file(POLICY) as policy,
        ):
            settings = settings_for(
                url, model.url, policy_file=policy, destinations={"tickets": TICKETS_URL}
            )
            act = run_in_worker(settings, url, measure_act, services=[relay_service])
        with database() as url:
            relay = measure_relay(url)
    finally:
        proc.terminate()
        proc.wait()
    report(
        "effects",
        [
            ("bare DBOS step POSTing to the ticket service (ms)", act["bare"], "baseline"),
            (
                "act step: effect+outbox, relay, workflow hears back (ms)",
                act["act"],
                f"{act['act'] / act['bare']:.2f}x (target <= 3x)",
            ),
            (
                f"relay throughput, {THROUGHPUT_N} effects (deliveries/s)",
                relay["rate"],
                "target >= 1,000/s",
            ),
            ("commit -> delivered, idle relay, p50 (ms)", relay["p50"], "target <= 20 ms"),
            ("commit -> delivered, idle relay, p95 (ms)", relay["p95"], ""),
        ],
    )
    baseline = Baseline("a bare DBOS step POSTing to the same ticket service", act["bare"], "ms")
    publish("effects", __doc__, baseline)


if __name__ == "__main__":
    main()

"""The database blips (restarted, `immediate`: every connection is cut mid-statement) while
runs are asking the model, reading and writing: nothing received is asked for again.

A step whose statements after the model call fail on the dead connection is retried inside
the step (ledgerloop.failures); the model's response, a read tool's result and a write's
outcome it received on the attempt before are kept (agent.keep), so the retry repeats only
the statements. Counted here at the source: the scripted Messages API server's requests,
and the downstream's GETs (one per read call) and POSTs (one per idempotency key).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ledgerloop.db.cluster import LocalCluster
from ledgerloop.db.connect import connect
from ledgerloop.runs.states import TERMINAL, RunStatus
from ledgerloop.runs.store import run_require
from ledgerloop.testing.downstream import RecordingDownstream
from ledgerloop.testing.postgres import wait_until
from ledgerloop.testing.processes import REPO, start_worker, stop_worker, worker_env
from tests.conftest import start_test_run
from tests.support.blip_agents import READ_URL_ENV
from tests.support.clusters import migrated_database

pytestmark = pytest.mark.crash

RUNS = 8
#: Read, write, read, answer: four model calls, two GETs and one POST per run. Each answer
#: takes a moment, so a blip finds calls in flight and steps about to checkpoint.
SCRIPT = """
default:
  turns:
    - {tool_use: {name: fetch_doc, input: {name: one}}, delay_ms: 500}
    - {tool_use: {name: ticket_idempotent, input: {title: blip}}, delay_ms: 500}
    - {tool_use: {name: fetch_doc, input: {name: two}}, delay_ms: 500}
    - {text: done, delay_ms: 300}
"""
TURNS = 4
#: Restarts, each this long after a model request arrived: the server is down (an immediate
#: stop, then crash recovery) while the answer is on its way back, so the step's statements
#: after the call (the run's move, the answer's save, the checkpoint) meet a dead connection.
BLIPS = 10  # at most: the loop stops once every turn was asked
BLIP_AFTER_S = (0.3, 0.45, 0.6)


def _repeated_model_calls(requests: list[dict[str, Any]]) -> dict[str, int]:
    """Model calls asked more than once: by the run's first message and the turn."""
    asked = Counter(
        f"{json.dumps(r['request']['messages'][0]['content'])} turn {r['turn']}" for r in requests
    )
    return {call: n for call, n in asked.items() if n > 1}


@pytest.mark.timeout(300)
def test_a_database_blip_repeats_no_model_call_read_or_write(
    cluster: LocalCluster, scripted_model: Any, tmp_path: Path
) -> None:
    url = migrated_database(cluster)
    model = scripted_model(SCRIPT)
    log = tmp_path / "worker.log"
    with RecordingDownstream(honours_keys=False) as downstream:
        env = worker_env(
            url,
            ANTHROPIC_BASE_URL=model.url,
            LEDGERLOOP_AGENT_MODULES="tests.support.blip_agents",
            LEDGERLOOP_POLICY_FILE=str(REPO / "tests" / "support" / "policy.yaml"),
            LEDGERLOOP_DESTINATIONS=json.dumps({"tickets": downstream.url}),
            **{READ_URL_ENV: downstream.url},
        )
        worker = start_worker(env, log=log)
        try:
            with connect(url, autocommit=True) as conn:
                run_ids = [start_test_run(conn, "blipper", f"blip {i}") for i in range(RUNS)]
                wait_until(lambda: len(model.requests()) >= RUNS // 2, timeout=60)
            blipped = _blip_while_asked(cluster, model)
            with connect(url, autocommit=True) as conn:

                def all_done() -> bool:
                    return all(run_require(conn, r).status in TERMINAL for r in run_ids)

                try:
                    wait_until(all_done, timeout=180)
                except AssertionError:
                    states = [run_require(conn, r).status.value for r in run_ids]
                    raise AssertionError(f"runs not ended: {states}\n{_tail(log)}") from None
                runs = [run_require(conn, r) for r in run_ids]
            assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * RUNS, [
                (r.status.value, r.state) for r in runs
            ]
            requests = model.requests()
            # The figure first (calls for turns), then which turns were asked again.
            assert (len(requests), _repeated_model_calls(requests)) == (TURNS * RUNS, {}), _tail(
                log
            )
            gets = downstream.gets_by_path()
            assert {p: n for p, n in gets.items() if n > 1} == {}, _tail(log)
            assert len(gets) == 2 * RUNS
            posts = downstream.count_by_key()
            assert {k: n for k, n in posts.items() if n > 1} == {}, _tail(log)
            assert {str(k).split(":")[0] for k in posts} == {str(r) for r in run_ids}
            assert worker.poll() is None, _tail(log)
            # The database did go under calls in flight: about once per turn (the runs'
            # requests arrive together, a turn at a time).
            assert blipped >= TURNS - 1
        finally:
            stop_worker(worker)


def _blip_while_asked(cluster: LocalCluster, model: Any) -> int:
    """Restart the database BLIPS times, each shortly after a model request arrived."""
    seen = len(model.requests())
    blipped = 0
    deadline = time.monotonic() + 120
    while blipped < BLIPS and time.monotonic() < deadline:
        requests = model.requests()
        if len(requests) >= TURNS * RUNS:
            break  # every turn asked (a repeat would not count here)
        if len(requests) == seen:
            time.sleep(0.01)
            continue
        after = BLIP_AFTER_S[blipped % len(BLIP_AFTER_S)]
        time.sleep(max(0.0, requests[-1]["at"] + after - time.time()))
        cluster.restart(mode="immediate")
        blipped += 1
        seen = len(model.requests())
    return blipped


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-15000:] if log.exists() else ""

"""A sandboxed command against the same command as a plain subprocess, side by side.

The command is `python3 -I -c 'print(sum(range(10**5)))'`: an interpreter start and a little
work, about what a model's short analysis script costs. Each way runs interleaved rounds on
one event loop, through the same asyncio subprocess plumbing; the sandboxed ways include
everything a sandbox tool step pays per command (writing the command's marker file, the
backend's command line, output capture with the limit, the cleanup after it).
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from ledgerloop.sandbox import Limits, SandboxHost
from scripts.benchmarks.common import report
from scripts.benchmarks.results import Baseline, publish, size

ARGV = ["python3", "-I", "-c", "print(sum(range(10**5)))"]
ROUNDS = {
    "bwrap": int(size("BENCH_SANDBOX_ROUNDS", "30", "1")),
    "gvisor": int(size("BENCH_SANDBOX_GVISOR_ROUNDS", "10", "1")),
}


async def plain() -> float:
    start = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *ARGV, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert out.strip() == b"4999950000"
    return time.perf_counter() - start


async def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="ll-sandbox-bench-"))
    root.chmod(0o711)
    host = SandboxHost(root)
    rows: list[tuple[str, float, str]] = []
    try:
        for backend, rounds in ROUNDS.items():
            sandbox = host.create(uuid.uuid4().hex, run_id="bench", backend=backend)
            base: list[float] = []
            boxed: list[float] = []
            await plain()  # warm the page cache for both
            for _ in range(rounds):
                base.append(await plain())
                start = time.perf_counter()
                result = await host.exec(sandbox, ARGV, Limits())
                boxed.append(time.perf_counter() - start)
                assert result.stdout.strip() == "4999950000", result
            await host.destroy(sandbox.id)
            b, s = statistics.median(base) * 1000, statistics.median(boxed) * 1000
            rows.append((f"{backend}: plain subprocess, median ms ({rounds} rounds)", b, ""))
            rows.append((f"{backend}: sandboxed, median ms", s, f"{s / b:.1f}x plain"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report("sandbox: one short python3 command, sandboxed vs plain", rows)
    publish("sandbox", __doc__, Baseline("the same command as a plain asyncio subprocess"))


if __name__ == "__main__":
    asyncio.run(main())

"""The HTTP intake under load: ``POST /v1/notices`` at a fixed rate against a real
``resetctl serve`` on loopback, SQLite, ``--send`` off (issue 28: 500 requests/s, p99
under 50 ms, no ``database is locked``).

Open loop: request i is due at start + i / rate whatever the answers before it did, and
its latency is counted from that due time (a client that falls behind counts the wait,
so a stall is not hidden by the requests it kept from being sent: no coordinated
omission). ``--clients`` threads share the schedule, each with its own keep-alive
connection (httpx). Every request is a new notice (its own Idempotency-Key), so each is
a write. With ``--sweep`` a ``resetctl sweep --max-runtime`` runs beside the server, as
cron's would, and takes the same write lock.

The client runs on the same machine as the server: on 2 cores they share the CPU, so the
figures are what this machine can do with both, not the server alone.

    python bench/serve.py                        # 3 rounds of 20 s at 500/s
    python bench/serve.py --rate 800 --seconds 10 --rounds 1 --sweep
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

TOKEN = "bench-token-" + "0123456789abcdef" * 3


def _start(directory: Path, threads: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    """``resetctl serve`` on a free loopback port; its base URL once it listens."""
    log = directory / "serve.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
    env.update(RESETCTL_DB=str(directory / "bench.db"), RESETCTL_CONFIG=str(directory / "c.toml"))
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "resetctl",
                "serve",
                "--bind",
                "127.0.0.1:0",
                "--threads",
                str(threads),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("serving resetctl on "):
                return process, line.split()[-1], log
        if process.poll() is not None:
            raise SystemExit(f"serve exited: {log.read_text()}")
        time.sleep(0.05)
    process.kill()
    raise SystemExit("serve did not start within 60 s")


def _timed(logs: str, warm: int, timed: int) -> list[str]:
    """The audit lines of the timed requests of every round (each round's warm-up
    requests come first)."""
    lines = [line for line in logs.splitlines() if "route=enqueue" in line][1:]  # _cold
    kept = []
    while lines:
        kept += lines[warm : warm + timed]
        lines = lines[warm + timed :]
    return kept


def _cold(base: str) -> float:
    """Seconds the first enqueue of a new server takes: its imports, its first database
    connection."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": "cold"}
    body = {"email": "cold@example.com", "reset_url": "https://shop.example/r/cold"}
    sent = time.perf_counter()
    httpx.post(f"{base}/v1/notices", json=body, headers=headers, timeout=30).raise_for_status()
    return time.perf_counter() - sent


def _cpu_seconds(pid: int) -> float:
    """CPU time (user and system) a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _waited(pid: int) -> float:
    """Seconds the process's threads have spent runnable but waiting for a CPU (the
    kernel's schedstat run delay, summed over threads alive now)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _round(
    base: str, rate: float, seconds: float, clients: int, offset: int, stalls: bool
) -> dict[str, object]:
    total = int(rate * seconds)
    # Warm up first, uncounted: each client's connection, each server thread's database
    # connection and the imports an enqueue makes on first use (measured apart: _cold).
    ready = threading.Barrier(clients + 1)
    go = threading.Event()
    begin: list[float] = []
    latencies: list[float] = []
    service: list[float] = []
    statuses: Counter[int] = Counter()
    errors: Counter[str] = Counter()
    lock = threading.Lock()
    counter = iter(range(total))
    trace: list[tuple[float, float, float]] = []
    client_waits: list[float] = []

    def client() -> None:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
            for w in range(10):
                http.post(
                    "/v1/notices",
                    content=json.dumps(
                        {"email": "w@example.com", "reset_url": "https://x.example/w"}
                    ),
                    headers={"Idempotency-Key": f"warm-{offset}-{threading.get_ident()}-{w}"},
                )
            ready.wait()
            go.wait()
            start = begin[0]
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    # This thread's own run delay, before it ends and its count with it.
                    stat = Path("/proc/thread-self/schedstat").read_text().split()
                    with lock:
                        client_waits.append(int(stat[1]) / 1e9)
                    return
                due = start + i / rate
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
                n = offset + i
                body = {
                    "email": f"user{n}@example.com",
                    "reset_url": f"https://shop.example/r/{n}",
                    "ttl": "10m",
                }
                sent = time.perf_counter()
                try:
                    response = http.post(
                        "/v1/notices",
                        content=json.dumps(body),
                        headers={"Idempotency-Key": f"bench-{n}"},
                    )
                    status = response.status_code
                except httpx.HTTPError as exc:
                    status, error = 0, type(exc).__name__
                else:
                    error = None
                done = time.perf_counter()
                with lock:
                    latencies.append(done - due)
                    if stalls:
                        trace.append((due - start, done - due, done - sent))
                    service.append(done - sent)
                    statuses[status] += 1
                    if error:
                        errors[error] += 1

    workers = [threading.Thread(target=client) for _ in range(clients)]
    for worker in workers:
        worker.start()
    ready.wait()
    begin.append(time.perf_counter() + 0.1)
    go.set()
    start = begin[0]
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - start
    if stalls:
        # Where the slow requests were: one stall holds up every request due during it.
        slow = sorted(t for t in trace if t[1] > 0.05)
        print(f"  {len(slow)} requests over 50 ms")
        last = -1.0
        for due, latency, answered in slow:
            if due - last > 0.2:
                print(
                    f"  from {due:.3f}s: {latency * 1000:.0f} ms since due,"
                    f" {answered * 1000:.0f} ms since sent"
                )
            last = due
    latencies.sort()
    service.sort()
    return {
        "requests": total,
        "achieved_per_s": round(total / elapsed, 1),
        "p50_ms": round(statistics.median(latencies) * 1000, 1),
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1),
        "service_p99_ms": round(service[int(0.99 * (len(service) - 1))] * 1000, 1),
        "statuses": dict(statuses),
        "errors": dict(errors),
        "client_waited": sum(client_waits),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16, help="client threads")
    parser.add_argument("--threads", type=int, default=8, help="server worker threads")
    parser.add_argument("--sweep", action="store_true", help="run a sweep beside it")
    parser.add_argument("--stalls", action="store_true", help="say when requests were slow")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="resetctl-bench-serve-") as scratch:
        directory = Path(scratch)
        tokens = directory / "tokens.toml"
        tokens.write_text(f'[tokens.bench]\ntoken = "{TOKEN}"\nscopes = ["enqueue", "read"]\n')
        tokens.chmod(0o600)
        (directory / "c.toml").write_text(
            '[serve]\ntokens_file = "tokens.toml"\n[privacy]\nhash_key_file = "hash.key"\n'
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESETCTL_")}
        env.update(
            RESETCTL_DB=str(directory / "bench.db"), RESETCTL_CONFIG=str(directory / "c.toml")
        )
        subprocess.run([sys.executable, "-m", "resetctl", "db", "init"], env=env, check=True)
        process, base, log = _start(directory, args.threads)
        sweeper = None
        if args.sweep:
            runtime = f"{int(args.rounds * (args.seconds + 2) + 5)}s"
            sweeper = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "resetctl",
                    "--log-level",
                    "warning",
                    "sweep",
                    "--max-runtime",
                    runtime,
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(directory / "sweep.log").open("wb"),
            )
        try:
            print(
                f"rate {args.rate:g}/s for {args.seconds:g}s x {args.rounds}, {args.clients}"
                f" clients, {args.threads} server threads, sweep {'on' if args.sweep else 'off'},"
                f" {os.cpu_count()} cores"
            )
            print(f"cold start: the first enqueue took {_cold(base) * 1000:.0f} ms")
            for n in range(args.rounds):
                server_cpu, client_cpu = _cpu_seconds(process.pid), time.process_time()
                server_wait = _waited(process.pid)
                result = _round(base, args.rate, args.seconds, args.clients, n * 10**7, args.stalls)
                requests = int(result["requests"])  # type: ignore[call-overload]
                server_cpu = _cpu_seconds(process.pid) - server_cpu
                client_cpu = time.process_time() - client_cpu
                result["server_cpu_ms_per_request"] = round(server_cpu / requests * 1000, 3)
                result["client_cpu_ms_per_request"] = round(client_cpu / requests * 1000, 3)
                # Time runnable but off-CPU: what the machine's other work took from us.
                seconds = args.seconds
                result["server_waited_for_cpu_ms_per_s"] = round(
                    (_waited(process.pid) - server_wait) / seconds * 1000, 1
                )
                result["client_waited_for_cpu_ms_per_s"] = round(
                    float(result.pop("client_waited")) / seconds * 1000,
                    1,  # type: ignore[arg-type]
                )
                print(f"round {n + 1}: " + json.dumps(result))
        finally:
            process.terminate()
            process.wait(timeout=30)
            if sweeper is not None:
                sweeper.terminate()
                sweeper.wait(timeout=60)
        logs = log.read_text()
        if args.sweep:
            logs += (directory / "sweep.log").read_text()
        made = sorted(
            float(part[3:])
            for line in _timed(logs, args.clients * 10, int(args.rate * args.seconds))
            for part in line.split()
            if part.startswith("ms=")
        )
        if made:
            print(
                f"server side, making the answer (auth, enqueue, JSON): p50"
                f" {statistics.median(made):.2f} ms, p99 {made[int(0.99 * (len(made) - 1))]:.2f}"
                f" ms, max {made[-1]:.2f} ms"
            )
        health = subprocess.run(
            [sys.executable, "-m", "resetctl", "health", "--json"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        print(f"notices by phase: {json.loads(health.stdout)['notices_by_phase']}")
        locked = logs.count("database is locked")
        unavailable = logs.count("answered 503")
        print(f"'database is locked' in the logs: {locked}; 503 answers logged: {unavailable}")


if __name__ == "__main__":
    main()

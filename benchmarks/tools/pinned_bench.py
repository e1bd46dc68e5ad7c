"""Runs many `kiln bench` invocations at once on a machine with many cores, each pinned to its own
physical cores, so that a lent machine's few minutes measure a whole suite.

Each job is one `kiln bench` command line with the thread count it asks for; it gets that many
physical cores of one socket (never two hyperthreads of one core), the cores no other job holds,
and runs under `taskset`. Jobs start in the order given, each as soon as its cores are free; none
starts after --launch-until seconds, none while --max-jobs run, and every one still running at
--deadline is killed (a killed job writes no JSON: order the jobs by importance).

Jobs running side by side share the memory bus and the last-level cache: compare modes measured in
the same conditions (a job's modes run one after another in its own process; the ratio of two
jobs' times carries the neighbours' noise too).

    python benchmarks/tools/pinned_bench.py --out DIR --exclude 14,15 --max-jobs 4 --launch-until 400 --deadline 530 \\
        'name|threads|ENV=V ...|bench args' ...

`--cores` prints the first CPU of each physical core this process may use, for a script that
sets some aside.
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path


def physical_cores() -> list[list[int]]:
    """Per socket, the first logical CPU of each physical core this process may run on."""
    allowed = os.sched_getaffinity(0)
    out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True, check=True).stdout
    seen: dict[tuple[int, int], int] = {}
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        cpu, core, socket = (int(x) if x else 0 for x in line.split(","))
        if cpu in allowed and (socket, core) not in seen:
            seen[(socket, core)] = cpu
    sockets: dict[int, list[int]] = {}
    for (socket, _), cpu in sorted(seen.items()):
        sockets.setdefault(socket, []).append(cpu)
    return list(sockets.values())


def parse_job(text: str) -> dict:
    name, threads, env, args = text.split("|", 3)
    return {"name": name, "threads": int(threads), "env": dict(kv.split("=", 1) for kv in env.split()),
            "args": shlex.split(args)}


def take_cores(free: list[list[int]], count: int) -> tuple[int, list[int]] | None:
    """`count` free cores of one socket, and that socket's index."""
    for index, socket in enumerate(free):
        if len(socket) >= count:
            taken = socket[:count]
            del socket[:count]
            return index, taken
    return None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    p.add_argument("--cores", action="store_true", help="print the usable physical cores' CPUs and exit")
    p.add_argument("--exclude", default="", help="CPUs left for other work, comma-separated")
    p.add_argument("--launch-until", type=float, default=400)
    p.add_argument("--deadline", type=float, default=530)
    p.add_argument("--max-jobs", type=int, default=0, help="at most this many jobs at once (0: as many as cores allow)")
    p.add_argument("jobs", nargs="*")
    a = p.parse_args()
    if a.cores:
        print(" ".join(str(c) for socket in physical_cores() for c in socket))
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    excluded = {int(c) for c in a.exclude.split(",") if c}
    free = [[c for c in socket if c not in excluded] for socket in physical_cores()]
    print(f"physical cores for the jobs: {free}; left for other work: {sorted(excluded)}", flush=True)
    pending = [parse_job(j) for j in a.jobs]
    running: list[tuple[dict, subprocess.Popen, tuple[int, list[int]], float]] = []
    start = time.monotonic()
    while pending or running:
        now = time.monotonic() - start
        for job, proc, cores, began in list(running):
            if proc.poll() is not None:
                running.remove((job, proc, cores, began))
                free[cores[0]].extend(cores[1])
                free[cores[0]].sort()
                print(f"[{now:6.0f} s] done {job['name']} rc={proc.returncode} in {now - began:.0f} s", flush=True)
        if now > a.deadline:
            for job, proc, cores, began in running:
                proc.kill()
                print(f"[{now:6.0f} s] KILLED {job['name']} at the deadline", flush=True)
            break
        if now < a.launch_until:
            for job in list(pending):
                if a.max_jobs and len(running) >= a.max_jobs:
                    break
                cores = take_cores(free, job["threads"])
                if cores is None:
                    continue
                pending.remove(job)
                log = open(out / f"{job['name']}.log", "w")
                cmd = ["taskset", "-c", ",".join(map(str, cores[1])), sys.executable, "-m", "benchmarks", "bench",
                       "--threads", str(job["threads"]), "--json", str(out / f"{job['name']}.json"), *job["args"]]
                env = {**os.environ, **job["env"]}
                proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
                running.append((job, proc, cores, now))
                print(f"[{now:6.0f} s] start {job['name']} on cores {cores[1]}: {' '.join(cmd[3:])}", flush=True)
        elif pending:
            for job in pending:
                print(f"[{now:6.0f} s] NOT STARTED {job['name']} (past --launch-until)", flush=True)
            pending.clear()
        time.sleep(1)


if __name__ == "__main__":
    main()

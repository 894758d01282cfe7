"""CPU per relayed call: where a relay's time goes, as opposed to how long a call waits.

The latency benchmark measures wall time, which mixes a relay's own work with the machine's
wake-up latency. This one reads each relay process's CPU time across sequential trivial calls,
for the reference relays of `_relay.py` (a `selectors` loop; a trio loop with mcpool's I/O
pattern and a watchfiles watcher, as the daemon runs) and for the daemon with a client on its
socket. The difference between the trio reference and mcpool is mcpool's own cost per call;
between the two references, the event loop's.

Repeatable on a machine shared with other work: CPU time is summed over every thread of the
process from /proc/PID/task/*/schedstat (nanoseconds of time on a CPU, so time spent waiting
for one is not counted), all relays run side by side and are measured in interleaved rounds
(each round calls each relay `--calls` times), and the figures are medians over the rounds. The
ratio (target: at most 1.3) is the median of the rounds' mcpool / trio-watch ratios; the ratio
of the two medians is printed beside it (under heavy load the two differ by tenths).

`--callgrind` counts instructions instead (valgrind's callgrind on the trio-watch reference
and on the daemon, zeroed after a warm-up and dumped after `--calls` calls): exact and the same
under any load, but user space only (the syscalls' kernel time, alike for both, is left out, so
this ratio reads higher than the CPU-time one). For comparing two versions of mcpool's code.

`--baseline REV` also measures the daemon of another revision (its tree exported with
`git archive` to a temporary folder, imported ahead of this checkout), side by side in the same
rounds: a before/after comparison that load on the machine affects alike.

    .venv/bin/python tools/bench/cpu.py [--calls N] [--rounds R] [--callgrind] [--baseline REV]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import psutil
from _common import FAST, Daemon, fake, kill_tree, table, write_result
from latency import reference, start_reference

WARMUP = 2000
TARGET_RATIO = 1.3  # issue 17: mcpool's CPU per call at most 1.3 x the trio-watch reference's
REFERENCE = "reference relay (trio-watch)"
MCPOOL = "mcpool daemon (socket client)"
LAYERS = ("protocol", "pool", "session", "daemon")  # pyproject's package-dir: mcpool.<layer>


def export_revision(rev: str) -> str:
    """An importable `mcpool` package of revision `rev`, in a temporary folder: its path."""
    root = tempfile.mkdtemp(prefix="mcpool-baseline-")
    tree = os.path.join(root, "tree")
    os.mkdir(tree)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    archive = subprocess.run(
        ["git", "-C", repo, "archive", rev], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    pkg = os.path.join(root, "pkg")
    os.mkdir(pkg)
    # The package's own files: src/mcpool, or a top-level mcpool/ in revisions before the move.
    own = os.path.join(tree, "src", "mcpool")
    if not os.path.isdir(own):
        own = os.path.join(tree, "mcpool")
    os.symlink(own, os.path.join(pkg, "mcpool"))
    for layer in LAYERS:
        os.symlink(os.path.join(tree, layer), os.path.join(own, layer))
    return pkg


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of `pid` so far (schedstat: ns on a CPU)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # a thread that ended between listdir and open
    return total / 1e9


def _msg(tool: str, i: int) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": "tools/call",
        "params": {"name": tool, "arguments": {"text": "x"}},
    }


def measure(call: Callable[[dict[str, Any]], Any], tool: str, pid: int, n: int) -> dict[str, float]:
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    for i in range(n):
        call(_msg(tool, i))
    t1, cpu1 = time.perf_counter(), cpu_seconds(pid)
    return {"cpu_us": (cpu1 - cpu0) / n * 1e6, "wall_us": (t1 - t0) / n * 1e6}


def relay_pid(mode: str) -> int:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(arg.endswith("_relay.py") for arg in cmdline) and mode in cmdline:
            return int(proc.pid)
    raise RuntimeError(f"no {mode} relay process")


CALLGRIND_WARMUP = 300
CALLGRIND_START = 300.0  # an interpreter and mcpool's imports run ~50 times slower under valgrind


def callgrind_wrapper(out_dir: str, name: str) -> list[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=yes",
        f"--callgrind-out-file={out_dir}/{name}.%p",
    ]


def instructions_during(pid: int, out_dir: str, name: str, run: Callable[[], None]) -> int:
    """Instructions the process at `pid` executes during `run()`."""
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    run()
    subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
    dumps = sorted(glob.glob(f"{out_dir}/{name}.{pid}.*"), key=os.path.getmtime)
    with open(dumps[-1]) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {dumps[-1]}")


def daemon_instructions_per_call(
    daemon: Daemon, conn: Any, out_dir: str, dump: str, calls: int
) -> float:
    """Instructions per f__echo call of a daemon under callgrind, after a warm-up."""
    for i in range(CALLGRIND_WARMUP):
        conn.call(_msg("f__echo", i))
    n = instructions_during(
        daemon.proc.pid,
        out_dir,
        dump,
        lambda: [conn.call(_msg("f__echo", i)) for i in range(calls)] and None,
    )
    return n / calls


def callgrind_main(args: argparse.Namespace) -> None:
    out_dir = tempfile.mkdtemp(prefix="mcpool-callgrind-")
    results: dict[str, float] = {}
    sock_path = os.path.join(out_dir, "relay.sock")
    relay, s, conn = start_reference(
        "trio-watch", sock_path, wrapper=callgrind_wrapper(out_dir, "reference")
    )
    try:
        for i in range(CALLGRIND_WARMUP):
            conn.call(_msg("echo", i))
        n = instructions_during(
            relay.pid,
            out_dir,
            "reference",
            lambda: [conn.call(_msg("echo", i)) for i in range(args.calls)] and None,
        )
        results[REFERENCE] = n / args.calls
        s.close()
    finally:
        kill_tree(relay)
    daemons = [(MCPOOL, "daemon", {})]
    if args.baseline:
        pkg = export_revision(args.baseline)
        daemons.append((f"mcpool daemon at {args.baseline}", "baseline", {"PYTHONPATH": pkg}))
    for name, dump, env in daemons:
        daemon = Daemon(
            {"f": fake(**FAST)},
            wrapper=callgrind_wrapper(out_dir, dump),
            start_timeout=CALLGRIND_START,
            extra_env=env,
        )
        try:
            sock, conn = daemon.connect()
            conn.handshake_and_list()
            results[name] = daemon_instructions_per_call(daemon, conn, out_dir, dump, args.calls)
            sock.close()
        finally:
            daemon.stop()
    ratio = results[MCPOOL] / results[REFERENCE]
    rows = [[name, f"{v:,.0f}"] for name, v in results.items()]
    print(
        f"callgrind, {args.calls:,} calls after a warm-up of {CALLGRIND_WARMUP} (dumps: {out_dir})"
    )
    print(table(["relay process", "instructions/call (user space)"], rows))
    for name in results:
        if name != REFERENCE:
            print(
                f"{name} / trio-watch reference: {results[name] / results[REFERENCE]:.2f} x in "
                f"instructions; its own {results[name] - results[REFERENCE]:,.0f}/call"
            )
    print(
        "wrote",
        write_result(
            "cpu-callgrind",
            {"calls": args.calls, "instructions_per_call": results, "ratio": ratio},
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5_000, help="calls per relay per round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument("--baseline", metavar="REV", help="also measure this revision's daemon")
    args = parser.parse_args()
    if args.callgrind:
        callgrind_main(args)
        return
    workdir = tempfile.mkdtemp(prefix="mcpool-cpu-")
    targets: dict[str, tuple[Callable[[dict[str, Any]], Any], str, int]] = {}
    cleanups: list[Callable[[], None]] = []
    daemon = Daemon({"f": fake(**FAST)})
    cleanups.append(daemon.stop)
    try:
        for mode in ("bare", "trio-watch"):
            path = reference(mode, workdir)
            cleanups.append(path.cleanup)
            targets[f"reference relay ({mode})"] = (path.call, path.tool, relay_pid(mode))
        sock, conn = daemon.connect()
        cleanups.append(sock.close)
        conn.handshake_and_list()
        targets[MCPOOL] = (conn.call, "f__echo", daemon.proc.pid)
        if args.baseline:
            pkg = export_revision(args.baseline)
            before = Daemon({"f": fake(**FAST)}, extra_env={"PYTHONPATH": pkg})
            cleanups.append(before.stop)
            bsock, bconn = before.connect()
            cleanups.append(bsock.close)
            bconn.handshake_and_list()
            targets[f"mcpool daemon at {args.baseline}"] = (
                bconn.call,
                "f__echo",
                before.proc.pid,
            )
        for call, tool, _pid in targets.values():
            for i in range(WARMUP):
                call(_msg(tool, i))
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        for _ in range(args.rounds):
            for name, (call, tool, pid) in targets.items():
                rounds[name].append(measure(call, tool, pid, args.calls))
    finally:
        for cleanup in reversed(cleanups):
            cleanup()
    results = {
        name: {
            "cpu_us": statistics.median(r["cpu_us"] for r in rs),
            "cpu_us_min": min(r["cpu_us"] for r in rs),
            "cpu_us_max": max(r["cpu_us"] for r in rs),
            "wall_us": statistics.median(r["wall_us"] for r in rs),
        }
        for name, rs in rounds.items()
    }
    ratios = [
        m["cpu_us"] / r["cpu_us"] for m, r in zip(rounds[MCPOOL], rounds[REFERENCE], strict=True)
    ]
    ratio = statistics.median(ratios)
    baseline_ratio = baseline_of_medians = None
    if args.baseline:
        name = f"mcpool daemon at {args.baseline}"
        baseline_ratio = statistics.median(
            m["cpu_us"] / r["cpu_us"] for m, r in zip(rounds[name], rounds[REFERENCE], strict=True)
        )
        baseline_of_medians = results[name]["cpu_us"] / results[REFERENCE]["cpu_us"]
    rows = [
        [
            name,
            f"{r['cpu_us']:.1f}",
            f"{r['cpu_us_min']:.1f}-{r['cpu_us_max']:.1f}",
            f"{r['wall_us']:.1f}",
        ]
        for name, r in results.items()
    ]
    print(f"{args.rounds} interleaved rounds of {args.calls:,} calls per relay; medians")
    print(
        table(
            ["relay process", "CPU us/call", "range over rounds", "wall us/call (client incl.)"],
            rows,
        )
    )
    own = results[MCPOOL]["cpu_us"] - results[REFERENCE]["cpu_us"]
    of_medians = results[MCPOOL]["cpu_us"] / results[REFERENCE]["cpu_us"]
    verdict = "meets" if ratio <= TARGET_RATIO else "misses"
    print(
        f"mcpool / trio-watch reference: {ratio:.2f} x (rounds {min(ratios):.2f}-"
        f"{max(ratios):.2f}; of the medians {of_medians:.2f}; mcpool's own {own:.1f} us/call); "
        f"{verdict} the "
        f"{TARGET_RATIO} x target"
    )
    if baseline_ratio is not None:
        print(
            f"{args.baseline} / trio-watch reference, the same rounds: {baseline_ratio:.2f} x "
            f"(of the medians {baseline_of_medians:.2f})"
        )
    print(
        "wrote",
        write_result(
            "cpu",
            {
                "baseline": args.baseline,
                "baseline_ratio": baseline_ratio,
                "baseline_ratio_of_medians": baseline_of_medians,
                "calls_per_round": args.calls,
                "rounds": args.rounds,
                "results": results,
                "ratio": ratio,
                "ratios": ratios,
                "ratio_of_medians": of_medians,
                "own_us": own,
                "target_ratio": TARGET_RATIO,
                "meets_target": ratio <= TARGET_RATIO,
            },
        ),
    )


if __name__ == "__main__":
    main()

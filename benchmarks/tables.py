"""One command for the tables of any committed results file, from the file alone.

    python benchmarks/tables.py docs/reports/FILE [FILE ...]   # print each file's tables
    python benchmarks/tables.py --check [DIR]                  # every file under DIR renders

Each file is dispatched by its name to the renderer of the script or module that wrote it
(:data:`KINDS`; every renderer loads no model and runs nothing): a ``verispec bench``
``X-results.jsonl`` to :mod:`verispec.bench.report` with ``X-meta.json`` where present (its
``summary.md`` is printed), a ``verispec bench serve`` report to
:mod:`verispec.bench.serve_report`, ``lawtest.json`` to :mod:`verispec.bench.lawtest` (its
``lawtest.md``), an ``int8-fidelity`` file to :mod:`verispec.bench.fidelity` (with the
per-prompt KL ratios against its 8-bit partner, :func:`fidelity_partner`), the others to their
script's ``--table`` / ``--report``. Where the docs set a file against others (a 7-bit run
against an 8-bit one, a serve run against vLLM's reports), the partners are rendered with it.
Prompt suites (inputs), rendered reports (``.md``) and figures (``.png``) are named as such.
``--check`` renders every file under DIR (default ``docs/reports``, recursively) and exits 1
listing each file it does not know or cannot render.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import importlib
import io
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
REPORTS = HERE.parent / "docs" / "reports"
#: 7-bit fidelity runs compared with an 8-bit run not named like them: the Zen 3 could not
#: run 8-bit codes, so its 7-bit run is set against the Xeon's 8-bit one (same prompts).
FIDELITY_AGAINST = {"int8-fidelity-7bit-epyc.json": "int8-fidelity.json"}
#: serve runs whose figures against vLLM come from the peers' own reports, merged with them
#: (the peers ran apart, hours before or after)
SERVE_PEERS = {name: ("serve-vllm-plain-xeon-vnni.json", "serve-vllm-spec-xeon-vnni.json")
               for name in ("serve-verispec-vs-vllm-xeon-vnni.json",
                            "serve-gamma-auto-xeon-vnni.json",
                            "serve-gamma-auto-admitted-reader-xeon-vnni.json",
                            "serve-gamma-auto-first-position-xeon-vnni.json",
                            "serve-gamma-auto-first-token-xeon-vnni.json")}

Renderer = Callable[[Path], str]


@dataclass(frozen=True)
class Kind:
    """Files named like ``pattern`` (a glob on the file name): what they are, the command
    that prints their tables (``{}``: the file) and the renderer (None: not a results file)."""

    pattern: str
    what: str
    command: str
    render: Renderer | None


def _script(name: str) -> ModuleType:
    """A script of ``benchmarks/`` (they import each other by plain name)."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    return importlib.import_module(name)


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _results(path: Path) -> str:
    from verispec.bench.report import regenerate

    meta = meta_of(path)
    with tempfile.TemporaryDirectory() as out:
        regenerate(path, Path(out), meta, plots=False, err=sys.stderr)
        return (Path(out) / "summary.md").read_text(encoding="utf-8")


def meta_of(results: Path) -> Path | None:
    """``X-meta.json`` beside ``X-results.jsonl``, where present."""
    meta = results.with_name(results.name.removesuffix("-results.jsonl") + "-meta.json")
    return meta if meta.is_file() else None


def _meta(path: Path) -> str:
    results = path.with_name(path.name.removesuffix("-meta.json") + "-results.jsonl")
    if not results.is_file():
        raise FileNotFoundError(f"no {results.name} beside it")
    return f"the settings of {results.name}; its tables: python benchmarks/tables.py {results}"


def fidelity_partner(path: Path) -> Path | None:
    """The 8-bit run a 7-bit fidelity file is compared with: the same name with ``8bit``,
    or :data:`FIDELITY_AGAINST`'s."""
    name = FIDELITY_AGAINST.get(path.name) or (
        path.name.replace("-7bit", "-8bit") if "-7bit" in path.name else None)
    partner = path.with_name(name) if name else None
    return partner if partner is not None and partner.is_file() else None


def _fidelity(path: Path) -> str:
    from verispec.bench.fidelity import render_file

    return render_file(path, fidelity_partner(path))


def _fidelity_command(path: Path) -> str:
    partner = fidelity_partner(path)
    return f"python -m verispec.bench.fidelity --report {path}" + (
        f" --against {partner}" if partner else "")


def _lawtest(path: Path) -> str:
    from verispec.bench.lawtest import markdown

    return markdown(_json(path))


def serve_peers(path: Path) -> list[Path]:
    """The peers' reports a serve run is merged with (:data:`SERVE_PEERS`)."""
    return [path.with_name(name) for name in SERVE_PEERS.get(path.name, ())]


def _serve(path: Path) -> str:
    from verispec.bench.serve_report import render_file

    return render_file(path, *serve_peers(path))


def _pearl(path: Path) -> str:
    from verispec.bench.pearl import render_file

    return render_file(str(path))


def _ray(path: Path) -> str:
    from verispec.server.ray_overhead import table

    lines = path.read_text(encoding="utf-8").splitlines()
    return table([json.loads(line) for line in lines if line.strip()])


def _summary_of(script: str) -> Renderer:
    """What a script's ``--report`` prints of the file's record (its ``summarize``)."""
    def render(path: Path) -> str:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            _script(script).summarize(_json(path))
        return out.getvalue()
    return render


def _pass_costs(path: Path) -> str:
    """The start-up grid of a timing record as measured: target passes over R rows of k
    tokens, and the draft's one-token step and first pass (two tokens per row)."""
    from verispec.engine.costs import BatchCosts

    record = _json(path)
    costs = BatchCosts.from_json(record["costs"])
    ks = sorted({k for _, k in costs.target})
    lines = [f"{record['target']} / {record['draft']}, context {record['context']} tokens "
             "(ms, as measured)", "",
             "| R | " + " | ".join(f"target k = {k}" for k in ks)
             + " | draft step | draft first pass | first / step |",
             "|---|" + "---|" * (len(ks) + 3)]
    for r in costs.rows:
        cells = [f"{costs.target[(r, k)] * 1e3:.1f}" if (r, k) in costs.target else ""
                 for k in ks]
        step, first = costs.draft.get(r), costs.draft_first.get(r)
        draft = [f"{t * 1e3:.1f}" if t is not None else "" for t in (step, first)]
        ratio = f"{first / step:.2f}" if step and first else ""
        lines.append(f"| {r} | " + " | ".join(cells + draft + [ratio]) + " |")
    lines.append(f"\ndraft prefill {costs.draft_prefill * 1e3:.2f} ms per prompt token")
    return "\n".join(lines) + "\n"


def _table_of(script: str, key: str | None = None) -> Renderer:
    """A script's ``table`` of the file's record (or of its ``key``)."""
    def render(path: Path) -> str:
        record = _json(path)
        return str(_script(script).table(record if key is None else record[key]))
    return render


def _kernels(path: Path) -> str:
    """The int8 kernels' self-test as ``verispec models kernels --out`` recorded it."""
    from verispec.models.native.kernels import report

    record = _json(path)
    return "\n".join([f"machine: {record['machine']}", *report(record)])


def _script_kind(pattern: str, what: str, script: str, key: str | None = None) -> Kind:
    """Files a ``benchmarks/`` script wrote, printed again by its ``--table`` (its ``table``
    of the record, or of the record's ``key``)."""
    return Kind(pattern, what, f"python benchmarks/{script}.py --table {{}}",
                _table_of(script, key))


#: First match wins. ``{}`` in a command is the file.
KINDS: tuple[Kind, ...] = (
    Kind("specbench-*.jsonl", "a prompt suite (an input of the benchmarks, not results)",
         "", None),
    Kind("lawtest.md", "the report lawtest wrote beside lawtest.json", "", None),
    Kind("*.md", "a rendered report", "", None),
    Kind("*.png", "a figure", "", None),
    Kind("*-results.jsonl", "verispec bench results",
         "python -m verispec.bench.report {} [--meta X-meta.json] --out DIR --no-plots",
         _results),
    Kind("*-meta.json", "verispec bench settings", "", _meta),
    Kind("lawtest.json", "two-sample law test", "python -m verispec.bench.lawtest --report {}",
         _lawtest),
    Kind("int8-fidelity*.json", "int8 fidelity (KL against float32)", "", _fidelity),
    Kind("int4-fidelity*.json", "int4 fidelity (KL against float32)", "", _fidelity),
    Kind("serve-*.json", "verispec bench serve report",
         "python -m verispec.bench.serve_report OUT.json {}", _serve),
    Kind("pearl-bench.json", "PEARL benchmark", "python -m verispec.bench.pearl --report {}",
         _pearl),
    Kind("ray-overhead-*.jsonl", "Ray Serve router overhead",
         "python -m verispec.server.ray_overhead --table {}", _ray),
    Kind("kernels-*.json", "the int8 kernels' self-test and choice",
         "verispec models kernels --table {}", _kernels),
    _script_kind("step-costs-*.json", "step costs", "step_costs"),
    _script_kind("int4-kernels-*.json", "int4 kernels", "int4_kernels", "rows"),
    _script_kind("draft-format-timing-*.json", "draft format timing", "draft_format_timing",
                 "rounds"),
    _script_kind("draft-formats-*.json", "draft formats side by side", "draft_formats"),
    _script_kind("draft-vocabulary-*.json", "draft vocabulary subsets", "draft_vocabulary"),
    _script_kind("cuda-steps-*.json", "CUDA step costs and decoding", "cuda_steps"),
    Kind("pass-costs-*.json", "the start-up pass-cost grid γ auto decides from (a record "
         "verispec writes under its cache directory at the first γ auto call)", "",
         _pass_costs),
    Kind("batch-gamma-*.json", "offline generate_batch with γ auto",
         "python benchmarks/batch_gamma.py --report {}", _summary_of("batch_gamma")),
    Kind("acceptance-memory-*.json", "how well a request's earlier blocks predict its next",
         "python benchmarks/acceptance_memory.py --report {}",
         _summary_of("acceptance_memory")),
    _script_kind("engine-overhead-*.json", "the engine's own time per iteration",
                 "engine_overhead"),
    _script_kind("engine-guard-*.json", "one engine against a baseline checkout",
                 "engine_guard"),
    _script_kind("draft-step-bytes-*.json", "the int4 draft's one-token step against the "
                 "time of reading its weights", "draft_step_bytes"),
    _script_kind("int4-builds-*.json", "two versions of the int4 kernel side by side",
                 "int4_builds"),
    _script_kind("int8-builds-*.json", "two versions of the int8 matmul side by side",
                 "int4_builds"),
    _script_kind("policy-time-*.json", "the time of γ auto's batch choice per iteration",
                 "policy_time"),
    _script_kind("retime-*.json", "a stale library split re-timed while running",
                 "retime_stale_split"),
    _script_kind("int8-codes-*.json", "int8 passes with the activation codes of the fused "
                 "kernel and of torch operators", "int8_codes"),
    _script_kind("int8-gemm-*.json", "int8 passes on oneDNN's int8 matmul and on verispec's",
                 "int8_gemm"),
    _script_kind("attention-*.json", "int8 passes on torch's float64 attention and on "
                 "verispec's", "attention"),
    _script_kind("float32-attention-*.json", "int4 passes before and after verispec's "
                 "attention over float32 caches and the SwiGLU in the down call",
                 "float32_attention"),
    _script_kind("thread-pools-*.json", "torch's kernels on a thread whose OpenMP team came "
                 "second", "thread_pools"),
)


def kind_of(path: Path) -> Kind | None:
    """The kind of a file, by its name (None: not known)."""
    return next((k for k in KINDS if fnmatch.fnmatch(path.name, k.pattern)), None)


def command_of(path: Path) -> str:
    """The command that prints the file's tables ("" where it has none)."""
    kind = kind_of(path)
    if kind is None:
        return ""
    if kind.render is _fidelity:
        return _fidelity_command(path)
    if kind.render is _serve:
        return " ".join(["python -m verispec.bench.serve_report OUT.json", str(path),
                         *map(str, serve_peers(path))])
    if kind.render is _results:
        meta = meta_of(path)
        return (f"python -m verispec.bench.report {path}"
                + (f" --meta {meta}" if meta else "") + " --out DIR --no-plots")
    return kind.command.format(path)


def render(path: Path) -> str:
    """The file's tables (or what it is, for inputs and renders); ValueError if unknown."""
    kind = kind_of(path)
    if kind is None:
        raise ValueError(f"{path}: not a known kind of results file")
    if kind.render is None:
        return f"{kind.what}: no tables"
    text = kind.render(path).rstrip("\n")
    if not text.strip():
        raise ValueError(f"{path}: its renderer printed nothing")
    return text


def check(root: Path) -> list[str]:
    """Render every file under ``root``; the problems (an empty list: all render)."""
    problems = []
    files = sorted(p for p in root.rglob("*") if p.is_file())
    if not files:
        return [f"{root}: no files"]
    for path in files:
        try:
            render(path)
        except Exception as exc:  # noqa: BLE001 - every failure is listed, none stops the check
            problems.append(f"{path}: {type(exc).__name__}: {exc}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="committed results files")
    ap.add_argument("--check", nargs="?", const=REPORTS, default=None, type=Path, metavar="DIR",
                    help=f"render every file under DIR (default {REPORTS}); exit 1 on any "
                         "file unknown or not rendered")
    args = ap.parse_args(argv)
    if args.check is not None:
        problems = check(args.check)
        for line in problems:
            print(line)
        count = sum(1 for p in args.check.rglob("*") if p.is_file())
        print(f"{count} files under {args.check}: "
              + (f"{len(problems)} not rendered" if problems else "every one known and rendered"))
        return 1 if problems else 0
    if not args.files:
        ap.error("give FILE(s) or --check [DIR]")
    status = 0
    for path in args.files:
        kind = kind_of(path)
        print(f"# {path}: {kind.what if kind else 'unknown'}"
              + (f" ({command_of(path)})" if command_of(path) else ""))
        try:
            print(render(path) + "\n")
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            status = 2
    return status


if __name__ == "__main__":
    raise SystemExit(main())

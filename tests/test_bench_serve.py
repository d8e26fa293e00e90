"""``verispec bench serve`` against a live toy server: configs per γ, temperatures, repeats,
the mean γ each config drafted and the γ auto comparison table."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from verispec.bench import serve  # noqa: E402
from verispec.bench.serve_report import auto_comparisons, render_comparisons  # noqa: E402
from verispec.models.toy import RandomContextLM, ToyTokenizer  # noqa: E402
from verispec.server import ServerConfig, ServerHandle, create_app  # noqa: E402

VOCAB, EOS = 8, 7


def _server() -> ServerHandle:
    target = RandomContextLM(VOCAB, 1, sharpness=2.0, eos_token_id=EOS, max_length=64)
    draft = RandomContextLM(VOCAB, 1, sharpness=1.5, max_length=64)
    target.name, target.tokenizer = "toy-target", ToyTokenizer(VOCAB)
    app = create_app(target, draft, ServerConfig(max_batch=2, shutdown_timeout_s=5.0))
    assert app.state.verispec.planner.default.gamma == "auto"  # the server's default
    handle = ServerHandle(app, "127.0.0.1", 0)
    handle.start(timeout_s=60)
    return handle


def test_configs_cross_methods_with_gammas() -> None:
    grid = serve.configs("ar,block,token", ["auto", "4"])
    assert [(c.method, c.gamma) for c in grid] == [
        ("ar", None), ("block", "auto"), ("block", "4"), ("token", "auto"), ("token", "4")]
    assert [(c.method, c.gamma) for c in serve.configs("ar,block", None)] == [
        ("ar", None), ("block", None)]
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--gamma", "auto,0"])


def test_bench_serve_reports_every_config_and_the_gamma_it_chose(tmp_path: Path) -> None:
    suite = tmp_path / "toy.jsonl"
    suite.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n"
                             for i, text in enumerate(["ABCA", "BBAC", "CADB"])))
    out = tmp_path / "serve.json"
    handle = _server()
    try:
        code = serve.main(["--url", handle.url, "--methods", "ar,block", "--gamma", "auto,2",
                           "--concurrency", "1,2", "--temperatures", "0,1", "--repeats", "2",
                           "--suite", str(suite), "--num-prompts", "3", "--max-tokens", "6",
                           "--no-warmup", "--out", str(out)])
    finally:
        assert handle.stop(deadline_s=2.0, timeout_s=60)
    assert code == 0
    report = json.loads(out.read_text())
    cells = report["cells"]
    # 2 repeats x 2 temperatures x 2 concurrencies x 3 configs, none failed
    assert len(cells) == 24 and all(c["errors"] == 0 and c["requests"] == 3 for c in cells)
    assert {c["label"] for c in cells} == {"ar", "block γ=auto", "block γ=2"}
    for c in cells:
        if c["label"] == "ar":
            assert c["mean_gamma"] in (0.0, None)
        elif c["label"] == "block γ=2":
            assert 0 < c["mean_gamma"] <= 2  # shortened only where the budget ends
        else:
            assert c["mean_gamma"] is not None and c["mean_gamma"] >= 0
    comparisons = report["comparisons"]
    assert {(e["temperature"], e["concurrency"]) for e in comparisons} == \
        {(0.0, 1), (0.0, 2), (1.0, 1), (1.0, 2)}
    for e in comparisons:
        assert e["config"] == "block γ=auto" and e["best_other"] in ("ar", "block γ=2")
        assert e["throughput"]["repeats"] == 2 and e["throughput"]["ci"] is not None
    assert "auto / best" in report["markdown"] and "mean γ" in report["markdown"]
    assert report["machine"]


def test_bench_serve_fixed_length_mode_decodes_every_budget(tmp_path: Path) -> None:
    """``--ignore-eos``: every request carries the ignore_eos extension and decodes exactly
    ``--max-tokens`` tokens, so sides compare equal output lengths."""
    suite = tmp_path / "toy.jsonl"
    suite.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n"
                             for i, text in enumerate(["ABCA", "BBAC"])))
    out = tmp_path / "serve.json"
    handle = _server()
    try:
        code = serve.main(["--url", handle.url, "--methods", "ar,block", "--gamma", "2",
                           "--concurrency", "2", "--temperatures", "1", "--suite", str(suite),
                           "--num-prompts", "2", "--max-tokens", "30", "--ignore-eos",
                           "--no-warmup", "--out", str(out)])
    finally:
        assert handle.stop(deadline_s=2.0, timeout_s=60)
    assert code == 0
    report = json.loads(out.read_text())
    assert report["config"]["ignore_eos"] is True
    cells = report["cells"]
    assert len(cells) == 2 and all(c["errors"] == 0 for c in cells)
    assert all(s["tokens"] == 30 for c in cells for s in c["samples"])


def _cell(label: str, gamma: str | None, repeat: int, tok_s: float) -> SimpleNamespace:
    return SimpleNamespace(label=label, gamma=gamma, temperature=0.0, concurrency=4,
                           repeat=repeat, throughput_tok_s=tok_s, tpot_p50_s=1.0 / tok_s,
                           block_efficiency=None, mean_gamma=None, errors=0)


def test_auto_is_compared_with_the_best_other_config_paired_by_repeat() -> None:
    cells = [_cell("ar", None, r, t) for r, t in enumerate([10.0, 12.0, 11.0])]
    cells += [_cell("block γ=8", "8", r, t) for r, t in enumerate([8.0, 9.0, 8.5])]
    cells += [_cell("block γ=auto", "auto", r, t) for r, t in enumerate([9.9, 11.9, 10.8])]
    (entry,) = auto_comparisons(cells)  # type: ignore[arg-type]
    assert entry["best_other"] == "ar"
    ratio, (low, high) = entry["throughput"]["ratio"], entry["throughput"]["ci"]
    assert 0.98 < ratio < 0.995 and low < ratio < high
    assert entry["tpot_vs_ar"]["ratio"] == pytest.approx(1 / ratio)
    assert "ar" in render_comparisons([entry])


#: A stand-in for ``verispec serve``: writes its pid to argv[1], prints its URL line, sleeps.
FAKE_SERVER = ("import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); "
               "print('fake serving on http://127.0.0.1:9/', flush=True); time.sleep(600)")
#: A benchmark holding the fake server through ``launched`` until it is ended.
BENCHMARK = """
import sys, time
from verispec.bench.serve import launched
with launched([sys.executable, "-c", sys.argv[1], sys.argv[2]]) as url:
    print("up", url, flush=True)
    time.sleep(600)
"""


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_terminated_benchmark_stops_the_server_it_started(tmp_path: Path) -> None:
    """SIGTERM to a benchmark inside ``launched`` stops the server it started and then ends
    the benchmark (Python's default for SIGTERM ends the process at once, which left the
    server running)."""
    import signal
    import subprocess
    import sys

    from conftest import wait_for

    pid_file = tmp_path / "server.pid"
    bench = subprocess.Popen([sys.executable, "-c", BENCHMARK, FAKE_SERVER, str(pid_file)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert bench.stdout is not None and bench.stdout.readline().startswith("up ")
        server = int(pid_file.read_text())
        assert _running(server)
        bench.send_signal(signal.SIGTERM)
        bench.wait(60)
        wait_for(lambda: not _running(server), timeout=30, what="the server to stop")
    finally:
        bench.kill()
        if pid_file.exists() and _running(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)

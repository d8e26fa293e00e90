"""``verispec serve``: a live server on 127.0.0.1 (a free port, in a thread or a subprocess),
driven by the official ``openai`` client and by raw HTTP.

Models are toy float64 tables (and the tiny Hugging Face pair once), so every response can
be compared token for token with offline :func:`verispec.generate` with the same prompt,
seed, method and γ. "Slow" doubles sleep in every forward pass so that requests overlap,
queues fill and clients can leave mid-stream. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

import verispec  # noqa: E402
from conftest import wait_for  # noqa: E402
from verispec.models.base import CausalLM  # noqa: E402
from verispec.models.hf import HFCausalLM  # noqa: E402
from verispec.models.toy import RandomContextLM, ToyTokenizer  # noqa: E402
from verispec.server import ServerConfig, ServerHandle, create_app  # noqa: E402
from verispec.server.cli import add_command  # noqa: E402
from verispec.server.testing import ChatToyTokenizer  # noqa: E402
from verispec.server.text import TextStream  # noqa: E402
from verispec.engine.loop import Engine  # noqa: E402

VOCAB, EOS, WINDOW = 12, 11, 64
MODEL = "toy-target"
ROOT = Path(__file__).resolve().parents[1]


class SlowLM(RandomContextLM):
    """A toy table that sleeps ``delay`` seconds in every forward pass, waits while its
    ``gate`` is closed (at most a minute) and raises while ``fail`` is set."""

    def __init__(self, *args: Any, delay: float = 0.0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.delay = delay
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()

    def _extend(self, tokens: list[list[int]], num_logits: int) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("injected fault")
        self.gate.wait(60)
        time.sleep(self.delay)
        return super()._extend(tokens, num_logits)  # [R, n, V] log-probabilities


def toy_pair(delay: float = 0.0) -> tuple[SlowLM, SlowLM]:
    """Target and draft: the same random table at two sharpnesses (so drafts get accepted),
    an EOS and a 64-token window. Fresh instances have identical tables."""
    target = SlowLM(VOCAB, 1, sharpness=2.0, eos_token_id=EOS, max_length=WINDOW, delay=delay)
    target.name, target.tokenizer = MODEL, ChatToyTokenizer(VOCAB)
    draft = SlowLM(VOCAB, 1, sharpness=1.5, max_length=WINDOW, delay=delay / 4)
    return target, draft


def offline(prompt: str | list[int], *, seed: int, method: str = "block", gamma: int = 3,
            temperature: float = 1.0, top_p: float | None = None, max_tokens: int = 16) -> str:
    """What ``verispec generate`` gives (fresh models), as text without a final EOS."""
    target, draft = toy_pair()
    result = verispec.generate(target, draft, prompt, method=method, gamma=gamma,
                               temperature=temperature, top_p=top_p, seed=seed,
                               max_new_tokens=max_tokens)
    tokens = result.tokens[:-1] if result.tokens and result.tokens[-1] == EOS else result.tokens
    return ToyTokenizer(VOCAB).decode(tokens)


def chat_prompt(content: str) -> str:
    from verispec.cli import _chat  # how ``verispec generate --chat`` wraps a prompt

    return _chat(ChatToyTokenizer(VOCAB), content)


@contextmanager
def live(target: CausalLM, draft: CausalLM | None, **config: Any) -> Iterator[ServerHandle]:
    """The app on 127.0.0.1:<free port> in a thread; stopped (and checked) afterwards.
    Requests give their γ; the default method's is fixed (γ auto would time the slow
    doubles at start-up)."""
    config.setdefault("shutdown_timeout_s", 5.0)
    config.setdefault("gamma", 8)
    handle = ServerHandle(create_app(target, draft, ServerConfig(**config)), "127.0.0.1", 0)
    handle.start(timeout_s=60)
    try:
        yield handle
    finally:
        assert handle.stop(deadline_s=2.0, timeout_s=60), "the server did not stop"


def client(handle: ServerHandle) -> Any:
    return openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0,
                         timeout=120)


def raw(handle: ServerHandle, method: str, path: str, body: bytes | dict | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """One plain HTTP request: status, headers and the JSON body (or the text)."""
    conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=60)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        text = resp.read().decode()
        try:
            payload = json.loads(text)
        except json.JSONDecodeError:
            payload = text
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload
    finally:
        conn.close()


def metrics(handle: ServerHandle) -> dict[str, float]:
    """``/metrics`` as {'name{label="v",...}': value} (samples in Prometheus' text format)."""
    from prometheus_client.parser import text_string_to_metric_families

    status, _, text = raw(handle, "GET", "/metrics")
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def stream_text(stream: Any, chat: bool = False) -> tuple[str, Any]:
    """Concatenated text of a stream and its last chunk with a finish reason."""
    parts, last = [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        piece = choice.delta.content if chat else choice.text
        parts.append(piece or "")
        if choice.finish_reason is not None:
            last = chunk
    return "".join(parts), last


# -- the endpoints --------------------------------------------------------------------------

def test_models_health_and_metrics_endpoints() -> None:
    with live(*toy_pair()) as h:
        ids = [m.id for m in client(h).models.list().data]
        assert ids == [MODEL]
        assert client(h).models.retrieve(MODEL).id == MODEL
        status, _, body = raw(h, "GET", "/health")
        assert status == 200 and body == {"status": "ok", "active_rows": 0, "queue_depth": 0}
        status, headers, text = raw(h, "GET", "/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        for name in ("verispec_queue_depth", "verispec_active_rows", "verispec_requests_total",
                     "verispec_tokens_generated_total", "verispec_target_passes_total",
                     "verispec_time_to_first_token_seconds",
                     "verispec_time_per_output_token_seconds", "verispec_block_efficiency",
                     "verispec_acceptance_by_position"):
            assert f"# TYPE {name.removesuffix('_total')}" in text, name


@pytest.mark.parametrize("method, temperature", [("ar", 1.0), ("token", 0.7), ("block", 1.0),
                                                 ("block", 0.0), ("lossy[epsilon=0.1]", 1.0)])
def test_completion_equals_offline_generate(method: str, temperature: float) -> None:
    with live(*toy_pair()) as h:
        resp = client(h).completions.create(
            model=MODEL, prompt="ABCA", max_tokens=20, temperature=temperature, seed=7,
            extra_body={"speculative": {"method": method, "gamma": 3}})
    want = offline("ABCA", seed=7, method=method, temperature=temperature, max_tokens=20)
    choice = resp.choices[0]
    assert choice.text == want
    assert choice.finish_reason == ("length" if len(want) == 20 else "stop")
    ext = resp.model_extra["speculative"]
    assert ext["method"] == method and ext["seed"] == 7 and ext["gamma"] == (0 if method == "ar"
                                                                             else 3)
    assert resp.usage.prompt_tokens == 4
    assert resp.usage.completion_tokens == len(want) + (len(want) < 20)  # the EOS counts
    assert resp.usage.total_tokens == 4 + resp.usage.completion_tokens
    assert ext["block_efficiency"] == pytest.approx(
        resp.usage.completion_tokens / ext["target_calls"])
    assert ext["accepted_tokens"] >= 0 and (method != "ar" or ext["accepted_tokens"] == 0)


def test_ignore_eos_decodes_the_whole_budget() -> None:
    """The ``ignore_eos`` extension (as vLLM's): an end-of-text token does not end the
    request, which decodes exactly its budget, the tokens of offline ``generate`` with
    ``ignore_eos``; without it the same seed stops at the EOS."""
    budget, spec = 40, {"method": "block", "gamma": 3}
    seed = next(s for s in range(50) if EOS in verispec.generate(
        *toy_pair(), "ABCA", method="block", gamma=3, seed=s, max_new_tokens=budget,
        ignore_eos=True).tokens[:-1])
    want = verispec.generate(*toy_pair(), "ABCA", method="block", gamma=3, seed=seed,
                             max_new_tokens=budget, ignore_eos=True)
    with live(*toy_pair()) as h:
        c = client(h)
        stopped = c.completions.create(model=MODEL, prompt="ABCA", max_tokens=budget, seed=seed,
                                       extra_body={"speculative": spec})
        full = c.completions.create(model=MODEL, prompt="ABCA", max_tokens=budget, seed=seed,
                                    extra_body={"speculative": spec, "ignore_eos": True})
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.usage.completion_tokens == want.tokens.index(EOS) + 1
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == budget == len(want.tokens)
    assert full.model_extra["speculative"]["target_calls"] > 0


def test_streamed_completion_and_chat_equal_offline_and_end_with_done() -> None:
    with live(*toy_pair(), method="token", gamma=2) as h:
        c = client(h)
        stream = c.completions.create(model=MODEL, prompt=[0, 1, 2], max_tokens=24, seed=11,
                                      stream=True, stream_options={"include_usage": True})
        chunks = list(stream)
        text, last = stream_text(chunks)
        assert text == offline([0, 1, 2], seed=11, method="token", gamma=2, max_tokens=24)
        assert last.usage.completion_tokens >= len(text)
        assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 3  # include_usage
        chat = c.chat.completions.create(model=MODEL, seed=5, max_tokens=18, messages=[
            {"role": "user", "content": "ABBA"}])
        want = offline(chat_prompt("ABBA"), seed=5, method="token", gamma=2, max_tokens=18)
        assert chat.choices[0].message.content == want
        assert chat.choices[0].message.role == "assistant"
        assert chat.usage.prompt_tokens == len(chat_prompt("ABBA"))
        stream = c.chat.completions.create(model=MODEL, seed=5, max_tokens=18, stream=True,
                                           messages=[{"role": "user", "content": "ABBA"}])
        text, last = stream_text(stream, chat=True)
        assert text == want and last.choices[0].finish_reason in ("stop", "length")
        assert last.model_extra["speculative"]["method"] == "token"
    with pytest.raises(AssertionError):  # the comparison can fail: another seed differs
        assert text == offline(chat_prompt("ABBA"), seed=6, method="token", gamma=2,
                               max_tokens=18)


def test_the_engine_is_told_which_requests_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed request (server ``stream: true``, an ``on_tokens`` callback offline)
    reaches the engine as streamed, so γ auto keeps its first token plain; one returned whole
    does not (nothing sees its first token before its last)."""
    seen: list[bool] = []
    submit = Engine.submit

    def spy(engine: Engine, request: Any) -> Any:
        seen.append(request.streamed)
        return submit(engine, request)

    monkeypatch.setattr(Engine, "submit", spy)
    with live(*toy_pair(), method="block", gamma="auto") as h:
        c = client(h)
        c.completions.create(model=MODEL, prompt=[0, 1, 2], max_tokens=4, seed=1)
        list(c.completions.create(model=MODEL, prompt=[0, 1, 2], max_tokens=4, seed=1,
                                  stream=True))
        assert seen[-2:] == [False, True]
    target, draft = toy_pair()
    verispec.generate(target, draft, [0, 1], gamma="auto", max_new_tokens=3)
    verispec.generate(target, draft, [0, 1], gamma="auto", max_new_tokens=3,
                      on_tokens=lambda new: None)
    verispec.generate_batch(target, draft, [[0, 1], [1]], gamma="auto", max_new_tokens=3)
    verispec.generate_batch(target, draft, [[0, 1], [1]], gamma="auto", max_new_tokens=3,
                            on_tokens=lambda i, new: None)
    assert seen[-6:] == [False, True, False, False, True, True]


def test_stop_strings_end_generation_and_are_never_emitted() -> None:
    want = offline("ABC", seed=3, max_tokens=40)
    stop = want[5:7]  # a string the output contains
    cut = want.index(stop)
    with live(*toy_pair()) as h:
        resp = client(h).completions.create(
            model=MODEL, prompt="ABC", max_tokens=40, seed=3, stop=[stop, "KKKKK"],
            extra_body={"speculative": {"gamma": 3}})
        stream = client(h).completions.create(
            model=MODEL, prompt="ABC", max_tokens=40, seed=3, stop=stop, stream=True,
            extra_body={"speculative": {"gamma": 3}})
        text, last = stream_text(stream)
    assert resp.choices[0].text == want[:cut] == text
    assert resp.choices[0].finish_reason == "stop" == last.choices[0].finish_reason
    assert resp.model_extra["speculative"]["stop_reason"] == "stop"
    assert resp.usage.completion_tokens < 40  # generation ended there


def test_sixteen_concurrent_streams_each_equal_offline() -> None:
    cases = [(["ABC", "BCA", "CCB", "AAAB"][i % 4], 100 + i, ["ar", "token", "block"][i % 3],
              [1.0, 0.8, 0.0, 1.0][i % 4], [None, 0.9][i % 2]) for i in range(16)]

    def one(case: tuple[str, int, str, float, float | None], handle: ServerHandle) -> str:
        prompt, seed, method, temperature, top_p = case
        stream = client(handle).completions.create(
            model=MODEL, prompt=prompt, max_tokens=24, seed=seed, temperature=temperature,
            top_p=top_p, stream=True, extra_body={"speculative": {"method": method, "gamma": 3}})
        text, last = stream_text(stream)
        assert last is not None and last.choices[0].finish_reason in ("stop", "length")
        return text

    with live(*toy_pair(delay=0.003), max_batch=4, max_queue=16) as h:
        with ThreadPoolExecutor(16) as pool:
            texts = list(pool.map(lambda c: one(c, h), cases))
        m = metrics(h)
    for case, text in zip(cases, texts, strict=True):
        prompt, seed, method, temperature, top_p = case
        assert text == offline(prompt, seed=seed, method=method, temperature=temperature,
                               top_p=top_p, max_tokens=24), case
    assert sum(m[f'verispec_requests_finished_total{{method="{k}",reason="{r}"}}']
               for k in ("ar", "token", "block") for r in ("eos", "max_new_tokens")
               if f'verispec_requests_finished_total{{method="{k}",reason="{r}"}}' in m) == 16
    row_calls = sum(v for k, v in m.items() if k.startswith("verispec_target_calls_total"))
    assert row_calls > m["verispec_target_passes_total"]  # rows shared target passes


def test_greedy_and_sampled_rows_of_one_method_in_one_batch_each_equal_offline() -> None:
    cases = [("ABC", 0.0, 1), ("CAB", 1.0, 2), ("BBA", 0.0, 3), ("ACB", 0.7, 4)]
    target, draft = toy_pair()
    target.gate.clear()  # hold the first iteration so that every request joins the batch

    def one(case: tuple[str, float, int], handle: ServerHandle) -> str:
        prompt, temperature, seed = case
        resp = client(handle).completions.create(
            model=MODEL, prompt=prompt, max_tokens=20, seed=seed, temperature=temperature,
            extra_body={"speculative": {"method": "block", "gamma": 3}})
        return str(resp.choices[0].text)

    with live(target, draft, max_batch=4) as h, ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(one, c, h) for c in cases]
        accepted = 'verispec_requests_total{endpoint="completions",status="200"}'
        wait_for(lambda: metrics(h).get(accepted) == 4, what="four requests")
        target.gate.set()
        texts = [f.result(60) for f in futures]
    for (prompt, temperature, seed), text in zip(cases, texts, strict=True):
        assert text == offline(prompt, seed=seed, temperature=temperature, max_tokens=20)


# -- bad input, load and faults ---------------------------------------------------------------

COMPLETION = {"model": MODEL, "prompt": "ABC", "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "AB"}], "max_tokens": 4}
BAD_INPUT = [  # (case, path, body, status, param)
    ("malformed JSON", "/v1/completions", b'{"model": ', 400, None),
    ("body not an object", "/v1/completions", b"[1, 2]", 400, None),
    ("missing model", "/v1/completions", {"prompt": "AB"}, 400, "model"),
    ("unknown model", "/v1/completions", {**COMPLETION, "model": "gpt-9"}, 404, "model"),
    ("temperature wrong type", "/v1/completions", {**COMPLETION, "temperature": "hot"}, 400,
     "temperature"),
    ("temperature out of range", "/v1/completions", {**COMPLETION, "temperature": 5}, 400,
     "temperature"),
    ("top_p zero", "/v1/completions", {**COMPLETION, "top_p": 0}, 400, "top_p"),
    ("max_tokens string", "/v1/completions", {**COMPLETION, "max_tokens": "4"}, 400,
     "max_tokens"),
    ("max_tokens zero", "/v1/completions", {**COMPLETION, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens beyond the context", "/v1/completions", {**COMPLETION, "max_tokens": 100}, 400,
     "max_tokens"),
    ("empty prompt", "/v1/completions", {**COMPLETION, "prompt": ""}, 400, "prompt"),
    ("prompt longer than the context", "/v1/completions", {**COMPLETION, "prompt": "A" * 70},
     400, "prompt"),
    ("prompt outside the vocabulary", "/v1/completions", {**COMPLETION, "prompt": "xyz"}, 400,
     "prompt"),
    ("token id outside the vocabulary", "/v1/completions", {**COMPLETION, "prompt": [1, 99]},
     400, "prompt"),
    ("several prompts", "/v1/completions", {**COMPLETION, "prompt": ["AB", "BA"]}, 400,
     "prompt"),
    ("n > 1", "/v1/completions", {**COMPLETION, "n": 2}, 400, "n"),
    ("logprobs", "/v1/completions", {**COMPLETION, "logprobs": 2}, 400, "logprobs"),
    ("unknown field", "/v1/completions", {**COMPLETION, "foo": 1}, 400, "foo"),
    ("stream not a bool", "/v1/completions", {**COMPLETION, "stream": "yes"}, 400, "stream"),
    ("negative seed", "/v1/completions", {**COMPLETION, "seed": -1}, 400, "seed"),
    ("empty stop string", "/v1/completions", {**COMPLETION, "stop": [""]}, 400, "stop"),
    ("unknown method", "/v1/completions", {**COMPLETION, "speculative": {"method": "nope"}},
     400, "speculative.method"),
    ("unbatchable method", "/v1/completions", {**COMPLETION, "speculative": {"method": "pearl"}},
     400, "speculative.method"),
    ("negative gamma", "/v1/completions", {**COMPLETION, "speculative": {"gamma": -1}}, 400,
     "speculative.gamma"),
    ("tools", "/v1/chat/completions", {**CHAT, "tools": [{"type": "function"}]}, 400, "tools"),
    ("no messages", "/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("unknown role", "/v1/chat/completions",
     {**CHAT, "messages": [{"role": "robot", "content": "A"}]}, 400, "messages[0].role"),
    ("body too large", "/v1/completions", b" " * 5000, 413, None),
]


def test_bad_input_answers_openai_errors_without_disturbing_a_running_request() -> None:
    want = offline("ABAB", seed=2, method="ar", max_tokens=60)
    target, draft = toy_pair(delay=0.01)
    with live(target, draft, max_body_bytes=4096) as h:
        running: dict[str, Any] = {}

        def long_request() -> None:
            stream = client(h).completions.create(
                model=MODEL, prompt="ABAB", max_tokens=60, seed=2, stream=True,
                extra_body={"speculative": {"method": "ar"}})
            running["text"], running["last"] = stream_text(stream)

        thread = threading.Thread(target=long_request)
        thread.start()
        wait_for(lambda: metrics(h)["verispec_active_rows"] == 1, what="the long request")
        target.gate.clear()  # it stays in the middle of its decoding while the table runs
        for case, path, body, status, param in BAD_INPUT:
            got, _, payload = raw(h, "POST", path, body)
            assert got == status, (case, payload)
            err = payload["error"]
            assert set(err) == {"message", "type", "param", "code"}, case
            assert err["param"] == param and err["message"], (case, err)
        assert raw(h, "GET", "/v1/completions")[0] == 405
        assert raw(h, "POST", "/v1/nothing", COMPLETION)[0] == 404
        with pytest.raises(openai.NotFoundError) as info:
            client(h).completions.create(model="gpt-9", prompt="A")
        assert info.value.body["code"] == "model_not_found"
        assert metrics(h)["verispec_active_rows"] == 1  # still decoding
        target.gate.set()
        thread.join(60)
    assert not thread.is_alive() and running["text"] == want
    assert len(BAD_INPUT) >= 12


def test_a_client_that_disconnects_frees_its_row() -> None:
    target, draft = toy_pair(delay=0.05)
    target.eos_token_ids = frozenset()  # every request runs to its budget (50 x 50 ms)
    with live(target, draft, method="ar") as h:
        stream = client(h).completions.create(model=MODEL, prompt="AB", max_tokens=50,
                                              seed=1, stream=True)
        chunks = iter(stream)
        next(chunks), next(chunks)
        assert metrics(h)["verispec_active_rows"] == 1
        stream.close()
        wait_for(lambda: metrics(h)["verispec_active_rows"] == 0, what="the row to be freed")
        # a non-streamed request whose client leaves is cancelled too
        conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps({**COMPLETION, "max_tokens": 50}),
                     {"Content-Type": "application/json"})
        wait_for(lambda: metrics(h)["verispec_active_rows"] == 1, what="the second request")
        conn.close()
        wait_for(lambda: metrics(h)["verispec_active_rows"] == 0, what="the second row")
        m = metrics(h)
    assert m['verispec_requests_finished_total{method="ar",reason="cancelled"}'] == 2
    assert m['verispec_tokens_generated_total{method="ar"}'] < 100


def test_a_full_queue_answers_429_with_retry_after_and_drops_nothing() -> None:
    target, draft = toy_pair()
    target.gate.clear()  # the first request holds the only row, the second waits
    with live(target, draft, method="ar", max_batch=1, max_queue=1, retry_after_s=2) as h:
        results: list[tuple[str, Any]] = []

        def hold(seed: int) -> None:
            stream = client(h).completions.create(model=MODEL, prompt="AB", max_tokens=12,
                                                  seed=seed, temperature=1.0, stream=True)
            results.append(stream_text(stream))

        threads = [threading.Thread(target=hold, args=(s,)) for s in (1, 2)]
        for t in threads:
            t.start()
        wait_for(lambda: (m := metrics(h))["verispec_queue_depth"] + m["verispec_active_rows"]
                 == 2, what="a full server")
        status, headers, body = raw(h, "POST", "/v1/completions", COMPLETION)
        assert status == 429 and headers["retry-after"] == "2"
        assert body["error"]["code"] == "queue_full" and body["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):
            client(h).completions.create(**COMPLETION)
        target.gate.set()
        for t in threads:
            t.join(60)
        assert metrics(h)['verispec_requests_total{endpoint="completions",status="429"}'] == 2
    assert len(results) == 2
    for seed in (1, 2):  # both held requests completed in full
        assert any(text == offline("AB", seed=seed, method="ar", max_tokens=12)
                   for text, _ in results)


def test_an_engine_fault_fails_the_batch_and_the_server_recovers() -> None:
    target, draft = toy_pair()
    with live(target, draft) as h:
        target.fail = True
        with pytest.raises(openai.InternalServerError):
            client(h).completions.create(model=MODEL, prompt="AB", max_tokens=5, seed=1)
        target.fail = False
        resp = client(h).completions.create(model=MODEL, prompt="AB", max_tokens=8, seed=1,
                                            extra_body={"speculative": {"gamma": 3}})
    assert resp.choices[0].text == offline("AB", seed=1, max_tokens=8)


def test_tiny_hf_pair_greedy_completion_and_no_chat_template(
        tiny: Callable[[str], HFCausalLM]) -> None:
    prompt = "t5 t6 t7 t8"
    want = verispec.generate(tiny("target"), tiny("close"), prompt, method="block", gamma=4,
                             temperature=0, max_new_tokens=12)
    with live(tiny("target"), tiny("close"), method="block", gamma=4) as h:
        resp = client(h).completions.create(model="tiny-target", prompt=prompt, max_tokens=12,
                                            temperature=0)
        assert resp.choices[0].text == want.text
        status, _, body = raw(h, "POST", "/v1/chat/completions", {**CHAT, "model": "tiny-target"})
    assert status == 400 and body["error"]["code"] == "no_chat_template"


def test_create_app_refuses_a_configuration_that_cannot_serve() -> None:
    target, draft = toy_pair()
    with pytest.raises(ValueError, match="schedule of its own"):
        create_app(target, draft, ServerConfig(method="pearl"))
    with pytest.raises(ValueError, match="draft model"):
        create_app(target, None, ServerConfig(method="block"))
    with pytest.raises(ValueError, match="unknown method"):
        create_app(target, draft, ServerConfig(method="nope"))
    with pytest.raises(ValueError, match="gamma"):
        create_app(target, draft, ServerConfig(method="ar", gamma="auto"))
    with pytest.raises(ValueError, match="max_queue"):
        ServerConfig(max_queue=-1)
    create_app(target, None, ServerConfig(method="ar"))


def test_an_idle_server_does_not_spin_and_leaves_no_thread_behind() -> None:
    with live(*toy_pair(), method="ar") as h:
        assert h._sock.proto == socket.IPPROTO_TCP  # so asyncio sets TCP_NODELAY (no Nagle)
        client(h).completions.create(model=MODEL, prompt="AB", max_tokens=3)
        cpu = time.process_time()
        time.sleep(1.0)
        assert time.process_time() - cpu < 0.5  # a spinning scheduler would burn ~1 s
    names = {t.name for t in threading.enumerate()}
    assert not names & {"verispec-scheduler", "verispec-http"}, names


# -- text and command line ----------------------------------------------------------------------

def test_text_stream_holds_back_stop_prefixes_and_strips_the_eos() -> None:
    tok = ToyTokenizer(VOCAB)
    ts = TextStream(tok.decode, ["CD", "BBB"], frozenset({EOS}))
    assert ts.feed([0, 1]) == "A"  # "B" may start "BBB"
    assert ts.feed([2]) == "B"  # "C" may start "CD"
    assert ts.feed([3, 0]) == "" and ts.stopped  # "CD": the text ends before it
    assert ts.sent == "AB" and ts.finish() == ""
    ts = TextStream(tok.decode, [], frozenset({EOS}))
    assert ts.feed([0, 1, EOS]) == "AB" and ts.finish() == ""


def test_cli_arguments_and_defaults() -> None:
    parser = argparse.ArgumentParser()
    add_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve"])
    assert (args.host, args.port, args.max_batch, args.max_queue) == ("127.0.0.1", 8000, 8, 64)
    assert args.method == "block" and args.gamma is None and args.precision == "auto"
    args = parser.parse_args(["serve", "--gamma", "auto", "--method", "token", "--port", "0",
                              "--target", "toy:random:5:1", "--max-batch", "2"])
    assert args.gamma == "auto" and args.method == "token" and args.max_batch == 2

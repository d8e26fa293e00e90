"""The command line, driven in-process with captured streams (no weights: toy models)."""

from __future__ import annotations

import io
import json

import pytest

from verispec.cli import build_parser, main
from verispec.methods import METHODS

TOY = ["--target", "toy:random:5:1", "--draft", "toy:random:5:2"]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_generate_help_lists_every_method_with_losslessness():
    sub = build_parser()._subparsers._group_actions[0].choices["generate"]  # type: ignore[union-attr]
    text = sub.format_help()
    for name, info in METHODS.items():
        line = next(line for line in text.splitlines() if line.strip().startswith(name + " "))
        assert ("NOT lossless" in line) == (not info.lossless), line
    assert {"ar", "token", "block"} <= set(METHODS)


def test_generate_streams_text_then_statistics():
    code, out, _ = run("generate", "ABCAB", *TOY, "--verifier", "block", "--gamma", "3",
                       "--max-new-tokens", "12", "--seed", "3")
    assert code == 0
    first_line = out.splitlines()[0]
    assert first_line.startswith("ABCAB") and len(first_line) == 5 + 12
    assert "block efficiency" in out and "method block (lossless)" in out


def test_generate_json_has_the_documented_keys_and_matches_the_api():
    code, out, _ = run("generate", "ABC", *TOY, "--verifier", "token", "--json",
                       "--max-new-tokens", "9", "--seed", "5")
    assert code == 0
    payload = json.loads(out)
    stats = payload["stats"]
    for key in ("block_efficiency", "mean_accepted", "target_calls", "draft_calls",
                "tokens_emitted", "wall_time_s", "perplexity"):
        assert key in stats
    assert stats["tokens_emitted"] == len(payload["tokens"]) == 9
    assert stats["block_efficiency"] == pytest.approx(9 / stats["target_calls"])
    import verispec

    api = verispec.generate("toy:random:5:1", "toy:random:5:2", "ABC", verifier="token",
                            max_new_tokens=9, seed=5)
    assert api.tokens == payload["tokens"] and api.text == payload["text"]


def test_ar_uses_no_draft_and_one_target_call_per_token():
    code, out, _ = run("generate", "AB", *TOY, "--verifier", "ar", "--json",
                       "--max-new-tokens", "7")
    stats = json.loads(out)["stats"]
    assert code == 0 and stats["draft_calls"] == 0 and stats["target_calls"] == 7


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "1.5"], "top_p"),
        (["--gamma", "0"], "gamma"),
        (["--top-k", "0"], "top_k"),
        (["--draft-quantize", "int8"], "cannot be quantized"),
    ],
)
def test_bad_parameters_exit_2_with_a_clear_message(args, message):
    code, _, err = run("generate", "AB", *TOY, "--json", *args)
    assert code == 2 and message in err


def test_missing_model_path_is_reported():
    code, _, err = run("generate", "AB", "--target", "/nonexistent/model", "--json")
    assert code == 2 and "not found" in err


def test_models_list_names_both_embedded_models():
    code, out, _ = run("models", "list")
    assert code == 0
    assert "qwen2.5-coder-0.5b-instruct" in out and "qwen2.5-coder-1.5b-instruct" in out

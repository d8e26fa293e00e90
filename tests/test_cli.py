"""The command line, driven in-process with captured streams (no weights: toy models)."""

from __future__ import annotations

import io
import json
import shlex
from pathlib import Path

import pytest

from verispec.cli import build_parser, main
from verispec.methods import METHODS

TOY = ["--target", "toy:random:5:1", "--draft", "toy:random:5:2"]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def run_or_usage(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Exit status and error text, whether the error comes from argparse (usage errors, on
    sys.stderr) or from the command itself."""
    try:
        code, _, err = run(*argv)
    except SystemExit as exc:
        return int(exc.code or 0), capsys.readouterr().err
    return code, err


def test_generate_help_lists_every_method_with_losslessness():
    sub = build_parser()._subparsers._group_actions[0].choices["generate"]  # type: ignore[union-attr]
    text = sub.format_help()
    for name, info in METHODS.items():
        line = next(line for line in text.splitlines() if line.strip().startswith(name + " "))
        assert ("NOT lossless" in line) == (not info.lossless), line
    assert {"ar", "token", "block"} <= set(METHODS)
    for info in METHODS.values():  # every option is listed with its default, bracket syntax
        for key, default in info.options().items():
            assert f"{key}={default}" in text, (info.name, key)
    assert "lossy[epsilon=0.05]" in text
    for flag in ("--precision", "--target-precision", "--draft-precision", "--chat"):
        assert flag in text
    for gone in ("--epsilon", "--num-drafts", "--dtype", "--draft-quantize", "--no-pre-verify",
                 "--verifier"):
        assert gone not in text


def test_generate_streams_text_then_statistics():
    code, out, _ = run("generate", "ABCAB", *TOY, "--method", "block", "--gamma", "3",
                       "--max-new-tokens", "12", "--seed", "3")
    assert code == 0
    first_line = out.splitlines()[0]
    assert first_line.startswith("ABCAB") and len(first_line) == 5 + 12
    assert "block efficiency" in out and "method block (lossless)" in out


def test_generate_json_has_the_documented_keys_and_matches_the_api():
    code, out, _ = run("generate", "ABC", *TOY, "--method", "token", "--json",
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

    api = verispec.generate("toy:random:5:1", "toy:random:5:2", "ABC", method="token",
                            max_new_tokens=9, seed=5)
    assert api.tokens == payload["tokens"] and api.text == payload["text"]
    assert stats["method"] == "token"


def test_method_options_in_brackets_match_the_api():
    code, out, err = run("generate", "ABC", *TOY, "--method", "lossy[epsilon=0.3,residual=target]",
                         "--gamma", "3", "--json", "--max-new-tokens", "9", "--seed", "2")
    assert code == 0, err
    payload = json.loads(out)
    assert payload["stats"]["method"] == "lossy" and payload["stats"]["lossless"] is False
    import verispec

    api = verispec.generate("toy:random:5:1", "toy:random:5:2", "ABC", method="lossy",
                            epsilon=0.3, residual="target", gamma=3, max_new_tokens=9, seed=2)
    assert api.tokens == payload["tokens"]
    assert api.stats.bias_tv_sum == pytest.approx(payload["stats"]["bias_tv_sum"], abs=1e-12)
    default = verispec.generate("toy:random:5:1", "toy:random:5:2", "ABC", method="lossy",
                                gamma=3, max_new_tokens=9, seed=2)
    assert default.stats.bias_tv_sum != api.stats.bias_tv_sum  # the options were applied


def test_ar_uses_no_draft_and_one_target_call_per_token():
    code, out, _ = run("generate", "AB", *TOY, "--method", "ar", "--json",
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
        # the precision reaches the right model's loader (toy models are exact float64 only)
        (["--draft-precision", "int8"], ("'toy:random:5:2'", "float64", "int8")),
        (["--target-precision", "bfloat16"], ("'toy:random:5:1'", "float64", "bfloat16")),
        (["--precision", "int8"], ("'toy:random:5:1'", "float64", "int8")),
        (["--precision", "float16"], "invalid choice: 'float16'"),
        (["--method", "lossy[epsilon=-1]"], "epsilon"),
        (["--method", "lossy[eps=0.1]"], "does not take the option(s) eps"),
        (["--method", "block[num_drafts=2]"], "does not take the option(s) num_drafts"),
        (["--method", "nope"], "unknown method 'nope'"),
        (["--chat"], "chat template"),
        (["--epsilon", "0.1"], "unrecognized arguments: --epsilon"),
        (["--num-drafts", "2"], "unrecognized arguments: --num-drafts"),
        (["--dtype", "float32"], "unrecognized arguments: --dtype"),
        (["--draft-quantize", "int8"], "unrecognized arguments: --draft-quantize"),
    ],
)
def test_bad_parameters_exit_2_with_a_clear_message(args, message, capsys):
    code, err = run_or_usage(capsys, "generate", "AB", *TOY, "--json", *args)
    parts = (message,) if isinstance(message, str) else message
    assert code == 2 and all(part in err for part in parts), err


def test_missing_model_path_is_reported():
    code, _, err = run("generate", "AB", "--target", "/nonexistent/model", "--json")
    assert code == 2 and "not found" in err


def test_models_path_reports_unknown_and_unfetched_models(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))  # an empty cache
    code, _, err = run("models", "path", "no-such-model")
    assert code == 2 and "unknown embedded model 'no-such-model'" in err
    for fmt in ("hf", "gguf"):
        code, out, err = run("models", "path", "qwen2.5-coder-0.5b-instruct", "--format", fmt)
        assert code == 2 and out == ""
        assert "is not fetched" in err and "verispec models fetch" in err
    code, err = run_or_usage(capsys, "models", "path", "qwen2.5-coder-0.5b-instruct",
                             "--format", "onnx")
    assert code == 2 and "invalid choice: 'onnx'" in err


def test_models_list_names_both_embedded_models():
    code, out, _ = run("models", "list")
    assert code == 0
    assert "qwen2.5-coder-0.5b-instruct" in out and "qwen2.5-coder-1.5b-instruct" in out


def test_bench_serve_is_the_server_load_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    """``verispec bench serve`` runs ``verispec.bench.serve`` (checked before any server
    starts)."""
    assert main(["bench", "serve", "--max-tokens", "0"]) == 2
    assert "--max-tokens, --num-prompts and --repeats must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["bench", "serve", "--help"])
    assert stop.value.code == 0 and "verispec bench serve" in capsys.readouterr().out


def _readme_toy_commands() -> list[list[str]]:
    """The README's ``verispec`` command lines that run toy models, split as a shell would
    (comments dropped)."""
    readme = Path(__file__).resolve().parents[1] / "README.md"
    lines = [line.strip() for line in readme.read_text(encoding="utf-8").splitlines()]
    return [shlex.split(line, comments=True) for line in lines
            if line.startswith("verispec ") and "toy:" in line]


def test_the_readme_toy_commands_run() -> None:
    commands = _readme_toy_commands()
    assert commands, "README.md shows no toy command"
    for argv in commands:
        assert argv[0] == "verispec"
        code, out, err = run(*argv[1:])
        assert code == 0, (argv, err)
        if argv[1] == "generate":  # the prompt comes back first, then the statistics
            assert out.startswith(argv[2]) and "block efficiency" in out, out

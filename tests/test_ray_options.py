"""``verispec serve --replicas`` without a cluster: its arguments, the model spec and
replica options, the importable app builder and the committed Serve config file."""

from __future__ import annotations

import argparse
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from verispec.server.cli import main as serve_main
from verispec.server.replica_options import ModelSpec, ReplicaOptions
from verispec.server.testing import MODEL

needs_ray = pytest.mark.skipif(find_spec("ray") is None, reason="the ray extra is not installed "
                                                                "(pip install 'verispec[ray]')")
pytestmark = [pytest.mark.ray,  # Ray Serve's own pydantic deprecations:
              pytest.mark.filterwarnings("ignore::DeprecationWarning:ray")]

ROOT = Path(__file__).resolve().parents[1]
FACTORY = "verispec.server.testing:toy_pair"


def test_replicas_without_the_ray_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    for name in ("verispec.server.ray_runner", "verispec.server.ray_serve",
                 "verispec.server.ray_state"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as without the extra
    assert serve_main(["--model-factory", FACTORY, "--replicas", "2"]) == 2
    message = capsys.readouterr().err
    assert "pip install 'verispec[ray]'" in message and "--replicas" in message


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--replicas", "2", "--max-replicas", "3"], "not both"),
    (["--min-replicas", "1"], "both --min-replicas and --max-replicas"),
    (["--min-replicas", "3", "--max-replicas", "2"], "0 <= --min-replicas <= --max-replicas"),
    (["--replicas", "2", "--replica-cpus", "-1"], "--replica-cpus must be >= 0"),
    (["--replicas", "2", "--model-factory", "no-colon"], "module:function"),
    (["--replicas", "2", "--model-factory", "verispec.server.testing:nothing"], "no function"),
])
def test_replica_arguments_are_checked_before_anything_starts(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = argv if "--model-factory" in argv else ["--model-factory", FACTORY, *argv]
    assert serve_main(argv) == 2
    assert message in capsys.readouterr().err


def test_model_spec_and_replica_options() -> None:
    spec = ModelSpec(factory=FACTORY, factory_kwargs={"delay": 0.0})
    target, draft = spec.load()
    assert target.name == MODEL and draft is not None
    with pytest.raises(ValueError, match="no function"):
        ModelSpec(factory="verispec.server.testing:nothing").load()
    with pytest.raises(ValueError, match="cannot import"):
        ModelSpec(factory="verispec.nothing_here:toy_pair").load()
    with pytest.raises(ValueError, match=r"must return \(target, draft or None\)"):
        ModelSpec(factory="verispec.server.testing:set_gate",
                  factory_kwargs={"control_dir": "/nonexistent", "closed": False}).load()
    with pytest.raises(ValueError, match="target model or a model factory"):
        ModelSpec()
    options = ReplicaOptions(replicas=2)
    assert options.engine_max_ongoing(4, 12) >= 16
    with pytest.raises(ValueError, match="below max_batch \\+ max_queue"):
        ReplicaOptions(replicas=2, max_ongoing_requests=10).engine_max_ongoing(4, 12)
    args = argparse.Namespace(replicas=None, min_replicas=None, max_replicas=None,
                              address=None, replica_cpus=1.0)
    assert ReplicaOptions.from_args(args) is None  # the single-process server
    args.address = "127.0.0.1:6379"
    assert ReplicaOptions.from_args(args) == ReplicaOptions(replicas=1)


def test_the_single_process_server_takes_a_model_factory() -> None:
    from verispec.server.cli import build_parser, config_from_args

    args = build_parser().parse_args(["--model-factory", FACTORY, "--factory-kwargs",
                                      '{"eos": false}', "--max-batch", "2"])
    target, _ = ModelSpec.from_args(args).load()
    assert target.eos_token_ids == frozenset() and config_from_args(args).max_batch == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--factory-kwargs", "[1]"])


@needs_ray
def test_the_app_builder_takes_verispec_serve_options() -> None:
    from verispec.server.ray_serve import app_builder, deployment_options

    app = app_builder({"model_factory": FACTORY, "factory_kwargs": '{"eos": false}',
                       "replicas": "3", "max_batch": 4, "max_queue": "12", "method": "token",
                       "gamma": 2, "no_draft": "false"})
    ingress = app._bound_deployment
    engine = ingress.init_args[0]._bound_deployment
    assert (ingress.name, engine.name, engine.num_replicas) == ("VerispecIngress",
                                                                "VerispecEngine", 3)
    assert engine.max_ongoing_requests >= 4 + 12 and ingress.ray_actor_options["num_cpus"] == 0
    spec, config = engine.init_args
    assert spec.factory_kwargs == {"eos": False} and (config.method, config.gamma) == ("token", 2)
    scaled, _ = deployment_options(config, ReplicaOptions(replicas=None, min_replicas=1,
                                                          max_replicas=4))
    assert scaled["autoscaling_config"]["target_ongoing_requests"] == config.max_batch
    for bad, message in [({"port": 8000}, "http_options.port"),
                         ({"replicaz": 2}, "unknown application argument"),
                         ({"no_draft": "maybe"}, "switch"),
                         ({"max_batch": "many"}, "invalid int value")]:
        with pytest.raises(ValueError, match=message):
            app_builder({"model_factory": FACTORY, **bad})


@needs_ray
def test_the_committed_serve_config_file_parses_and_builds() -> None:
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from verispec.server.replica_options import load_factory

    raw = yaml.safe_load((ROOT / "docs" / "ray-serve.yaml").read_text())
    schema = ServeDeploySchema.model_validate(raw)
    assert schema.http_options.host == "127.0.0.1"
    (app,) = schema.applications
    built = load_factory(app.import_path)(app.args)
    engine = built._bound_deployment.init_args[0]._bound_deployment
    spec, config = engine.init_args
    assert spec.target and spec.draft and engine.num_replicas == app.args["replicas"]
    assert engine.max_ongoing_requests >= config.max_batch + config.max_queue


@needs_ray
def test_the_local_serve_settings_are_ray_serves_own_and_place_the_ingress_ports() -> None:
    """Every setting names an environment variable that Ray Serve reads (a renamed one
    would be ignored without a word), the ingress replicas take ``port`` and the ports
    after it, and a port range that does not fit is refused."""
    from ray.serve._private import constants

    from verispec.server.ray_runner import local_serve_env

    source = Path(constants.__file__).read_text()
    env = local_serve_env(8000, ingress_replicas=2)
    for name in env:
        assert f'"{name}"' in source, name
    assert env["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "1"
    first, end = (int(env[f"RAY_SERVE_DIRECT_INGRESS_{k}_HTTP_PORT"]) for k in ("MIN", "MAX"))
    assert list(range(first, end)) == [8000, 8001]  # Serve allocates from range(MIN, MAX)
    for port, count in ((0, 1), (65535, 2), (8000, 0)):
        with pytest.raises(ValueError, match="ingress port"):
            local_serve_env(port, count)

"""EnergyMeter: RAPL reading, wraparound and unavailable reporting on a fake powercap tree;
NVML on a fake pynvml module. Nothing is ever estimated: no sensor means joules is None."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest
import torch

from verispec.telemetry import energy
from verispec.telemetry.energy import EnergyMeter, rapl_packages


def _domain(root: Path, dirname: str, name: str, energy_uj: int, max_uj: int = 10**9) -> Path:
    d = root / dirname
    d.mkdir(parents=True)
    (d / "name").write_text(name + "\n")
    (d / "energy_uj").write_text(f"{energy_uj}\n")
    (d / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return d


def _set(d: Path, energy_uj: int) -> None:
    """A new counter value, replaced atomically (a polling thread never reads a half-written
    file, as it never does in sysfs)."""
    tmp = d / "energy_uj.tmp"
    tmp.write_text(f"{energy_uj}\n")
    tmp.replace(d / "energy_uj")


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "powercap"
    root.mkdir()
    monkeypatch.setattr(energy, "POWERCAP_ROOT", root)
    return root


def test_rapl_sums_packages_only(fake_root: Path) -> None:
    pkg0 = _domain(fake_root, "intel-rapl:0", "package-0", 1_000_000)
    pkg1 = _domain(fake_root, "intel-rapl:1", "package-1", 5_000_000)
    core = _domain(fake_root, "intel-rapl:0:0", "core", 0)  # sub-domain: overlaps package-0
    psys = _domain(fake_root, "intel-rapl:2", "psys", 0)  # platform: overlaps the packages
    mmio = _domain(fake_root, "intel-rapl-mmio:0", "package-0", 0)  # duplicate of package-0
    with EnergyMeter("cpu", poll_interval_s=None) as meter:
        _set(pkg0, 3_500_000)  # +2.5 J
        _set(pkg1, 5_250_000)  # +0.25 J
        for d in (core, psys, mmio):
            _set(d, 777_000_000)  # must be ignored
    assert meter.joules == pytest.approx(2.75, abs=1e-12)
    assert meter.source.startswith("RAPL package-0")
    assert "package-1" in meter.source and str(pkg0) in meter.source
    assert "psys" not in meter.source and "mmio" not in meter.source


def test_rapl_wraparound(fake_root: Path) -> None:
    d = _domain(fake_root, "intel-rapl:0", "package-0", 999_000, max_uj=1_000_000)
    with EnergyMeter("cpu", poll_interval_s=None) as meter:
        _set(d, 500)  # wrapped: (1_000_000 - 999_000) + 500 µJ
    assert meter.joules == pytest.approx(1_500e-6, abs=1e-15)


def test_rapl_polling_catches_two_wraps(fake_root: Path) -> None:
    d = _domain(fake_root, "intel-rapl:0", "package-0", 900, max_uj=1_000)
    with EnergyMeter("cpu", poll_interval_s=None) as meter:
        _set(d, 100)
        meter.poll()  # first wrap: 200 µJ
        _set(d, 50)  # second wrap: 950 µJ
    assert meter.joules == pytest.approx(1_150e-6, abs=1e-15)
    # Negative control: without the intermediate poll only one wrap (150 µJ) is visible.
    _set(d, 900)
    with EnergyMeter("cpu", poll_interval_s=None) as blind:
        _set(d, 50)
    assert blind.joules == pytest.approx(150e-6, abs=1e-15)


def test_rapl_background_thread_runs(fake_root: Path) -> None:
    d = _domain(fake_root, "intel-rapl:0", "package-0", 0)
    with EnergyMeter("cpu", poll_interval_s=0.001) as meter:
        _set(d, 4_000_000)
        assert meter._thread is not None and meter._thread.is_alive()
    assert meter._thread is None
    assert meter.joules == pytest.approx(4.0, abs=1e-12)


def test_unavailable_without_powercap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-powercap"
    monkeypatch.setattr(energy, "POWERCAP_ROOT", missing)
    with EnergyMeter("cpu") as meter:
        pass
    assert meter.joules is None
    assert meter.source.startswith("unavailable: ") and str(missing) in meter.source


def test_unavailable_without_package_domain(fake_root: Path) -> None:
    _domain(fake_root, "intel-rapl:0", "psys", 10)
    with EnergyMeter("cpu") as meter:
        pass
    assert meter.joules is None
    assert "no readable" in meter.source and meter.source.startswith("unavailable: ")


def test_unavailable_when_unreadable(fake_root: Path) -> None:
    d = _domain(fake_root, "intel-rapl:0", "package-0", 10)
    (d / "energy_uj").unlink()
    (d / "energy_uj").mkdir()  # unreadable as a file even for root (the tests may run as root)
    domains, reason = rapl_packages()
    assert domains == [] and "not readable" in reason and str(d) in reason
    with EnergyMeter("cpu") as meter:
        pass
    assert meter.joules is None and "not readable" in meter.source


def test_failed_read_reports_unavailable(fake_root: Path) -> None:
    d = _domain(fake_root, "intel-rapl:0", "package-0", 10)
    with EnergyMeter("cpu", poll_interval_s=None) as meter:
        (d / "energy_uj").write_text("garbage\n")
    assert meter.joules is None and meter.source.startswith("unavailable: reading RAPL failed")


def test_nvml_fake(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([10_000, 10_000, 12_500])  # mJ: probe, start, end
    calls: list[str] = []
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: calls.append("init")  # type: ignore[attr-defined]
    fake.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)  # type: ignore[attr-defined]
    fake.nvmlDeviceGetTotalEnergyConsumption = lambda h: next(readings)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace())
    with EnergyMeter(torch.device("cuda", 1)) as meter:
        pass
    assert meter.joules == pytest.approx(2.5, abs=1e-12)
    assert meter.source == "NVML GPU 1"
    assert calls == ["init", "shutdown"]


def test_cuda_without_pynvml_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with EnergyMeter(torch.device("cuda", 0)) as meter:
        pass
    assert meter.joules is None and "pynvml" in meter.source
    assert meter.source.startswith("unavailable: ")

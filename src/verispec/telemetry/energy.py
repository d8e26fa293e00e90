"""Energy measured by a real power sensor, or reported as unavailable — never estimated.

Energy per token is the MJSD paper's second metric (Section 4, Appendix B). Sources:

* **NVML** for runs on an NVIDIA GPU: ``nvmlDeviceGetTotalEnergyConsumption`` (millijoules
  since the driver loaded; Volta or newer), if the ``pynvml`` module (package
  ``nvidia-ml-py``) imports and CUDA is available. GPU energy only, like the paper.
* **RAPL** for runs on the CPU: the Linux powercap interface
  ``/sys/class/powercap/intel-rapl:N/energy_uj`` (also used for AMD CPUs). The top-level
  *package* domains are summed (sub-domains such as ``core`` and the ``psys`` platform
  domain are excluded because they overlap the packages). A counter that decreased has
  wrapped: its delta is ``(max_energy_range_uj - start) + end``. A background thread polls
  the counters every ``poll_interval_s`` seconds so that a long run cannot wrap twice
  unseen. Since Linux 5.10 ``energy_uj`` is readable by root only.

Anything else yields ``joules = None`` and a ``source`` beginning with ``"unavailable: "``
followed by the precise reason.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import torch

__all__ = ["POWERCAP_ROOT", "EnergyMeter", "RaplDomain", "rapl_packages"]

#: Where the powercap class lives (a module global so tests can point it at a fake tree).
POWERCAP_ROOT = Path("/sys/class/powercap")

_PACKAGE_DIR = re.compile(r"^intel-rapl:(\d+)$")


@dataclass(frozen=True)
class RaplDomain:
    """A top-level RAPL package domain: its sysfs directory, name and counter range (µJ)."""

    path: Path
    name: str
    max_range_uj: int

    def read_uj(self) -> int:
        return int((self.path / "energy_uj").read_text().strip())


def rapl_packages(root: Path | None = None) -> tuple[list[RaplDomain], str]:
    """The readable RAPL package domains under ``root`` (default :data:`POWERCAP_ROOT`).

    Returns the domains, and if there are none, the reason why.
    """
    root = POWERCAP_ROOT if root is None else root
    if not root.is_dir():
        return [], f"{root} does not exist (no powercap/RAPL interface on this host)"
    found = sorted((int(m.group(1)), d) for d in root.iterdir() if (m := _PACKAGE_DIR.match(d.name)))
    domains: list[RaplDomain] = []
    for _, d in found:
        try:
            name = (d / "name").read_text().strip()
            if not name.startswith("package"):
                continue  # psys (platform) overlaps the packages
            domain = RaplDomain(d, name, int((d / "max_energy_range_uj").read_text().strip()))
            domain.read_uj()
        except (OSError, ValueError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            return [], (f"{d}/energy_uj is not readable ({reason}); RAPL counters are "
                        "root-only since Linux 5.10")
        domains.append(domain)
    if not domains:
        return [], f"no readable {root}/intel-rapl:N/energy_uj package domain"
    return domains, ""


def _nvml(device: torch.device) -> tuple[Any, Any, str]:
    """(pynvml module, handle, label) for ``device``, or (None, None, reason)."""
    try:
        import pynvml  # type: ignore[import-not-found]
    except ImportError:
        return None, None, "pynvml (nvidia-ml-py) is not installed, so NVML cannot be read"
    if not torch.cuda.is_available():
        return None, None, "CUDA is not available"
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        pynvml.nvmlInit()
        handle = None
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
        if uuid is not None:  # robust to CUDA_VISIBLE_DEVICES renumbering
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:  # noqa: BLE001 - any NVML failure: fall back to the index
                handle = None
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception as err:  # noqa: BLE001 - NVMLError_NotSupported and friends
        return None, None, f"NVML cannot read the energy of GPU {index}: {err}"
    return pynvml, handle, f"NVML GPU {index}"


class EnergyMeter:
    """Context manager measuring the energy of the enclosed block from a real sensor.

    After exit, ``joules`` is the energy in joules (None if no sensor) and ``source`` names
    the sensor, e.g. ``"RAPL package-0 (/sys/class/powercap/intel-rapl:0)"``, ``"NVML GPU 0"``
    or ``"unavailable: <reason>"``. CUDA devices are measured with NVML, CPU runs with RAPL.

    Args:
        device: where the measured computation runs.
        poll_interval_s: RAPL polling period of the background thread (None: poll only on
            entry, exit and explicit :meth:`poll` calls).
    """

    def __init__(self, device: torch.device | str = "cpu", *, poll_interval_s: float | None = 10.0) -> None:
        self.device = torch.device(device)
        self.poll_interval_s = poll_interval_s
        self.joules: float | None = None
        self.source = "unavailable: not measured yet"
        self._rapl: list[RaplDomain] = []
        self._last: list[int] = []
        self._uj = 0
        self._nvml: Any = None
        self._handle: Any = None
        self._start_mj = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error = ""

    def __enter__(self) -> Self:
        self.joules, self._uj, self._error = None, 0, ""
        if self.device.type == "cuda":
            self._nvml, self._handle, label = _nvml(self.device)
            if self._nvml is None:
                self.source = f"unavailable: {label} (RAPL is not used: it does not measure GPUs)"
                return self
            self.source = label
            self._start_mj = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        elif self.device.type == "cpu":
            self._rapl, reason = rapl_packages()
            if not self._rapl:
                self.source = f"unavailable: {reason}; NVML is not used (the run is on the CPU)"
                return self
            self.source = "RAPL " + " + ".join(f"{d.name} ({d.path})" for d in self._rapl)
            self._last = [d.read_uj() for d in self._rapl]
            if self.poll_interval_s is not None:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, daemon=True, name="rapl-poll")
                self._thread.start()
        else:
            self.source = f"unavailable: no energy sensor for device type {self.device.type!r}"
        return self

    def poll(self) -> None:
        """Fold the RAPL counters' progress since the last poll into the total."""
        if not self._rapl:
            return
        try:
            now = [d.read_uj() for d in self._rapl]
        except (OSError, ValueError) as err:
            self._error = f"reading RAPL failed: {err}"
            return
        with self._lock:
            for i, (d, value) in enumerate(zip(self._rapl, now, strict=True)):
                delta = value - self._last[i]
                self._uj += delta if delta >= 0 else d.max_range_uj - self._last[i] + value
                self._last[i] = value

    def _run(self) -> None:
        assert self.poll_interval_s is not None
        while not self._stop.wait(self.poll_interval_s):
            self.poll()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        if self._nvml is not None:
            try:
                if torch.cuda.is_available():
                    torch.cuda.synchronize(self.device)  # count the queued GPU work too
                end_mj = int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
                self.joules = (end_mj - self._start_mj) / 1000.0
            except Exception as err:  # noqa: BLE001 - report, never guess
                self._error = f"reading NVML failed: {err}"
            finally:
                self._nvml.nvmlShutdown()
                self._nvml = None
        elif self._rapl:
            self.poll()
            self.joules = None if self._error else self._uj / 1e6
        if self._error:
            self.source = f"unavailable: {self._error}"

"""Where a local sweep (`attnsweep run`) runs: the backend of its kernel, asked once for the
device facts that plan the sweep, the GPUs it is spread over and its worker processes.

Every refusal is a TargetError whose line names the option of `attnsweep run` and the rule;
`infrastructure` marks a device that is not there (an outage, not a usage mistake).
"""
from __future__ import annotations

from dataclasses import dataclass

from isolation.confined import backend_for
from isolation.sanitize import check_request
from kernels.backends.base import Backend, BackendUnavailable, DeviceInfo
from kernels.devices import resolve_gpus
from kernels.plugins import KernelSpecError


class TargetError(ValueError):
    """A local sweep's target refused: one line naming the option and the rule."""

    def __init__(self, message: str, infrastructure: bool = False) -> None:
        super().__init__(message)
        self.infrastructure = infrastructure


@dataclass(frozen=True)
class Target:
    """The device facts of the backend that runs the sweep, the GPUs and the processes."""

    info: DeviceInfo
    gpus: tuple[int, ...]
    jobs: int


def load_backend(kernel: str, backend: str, defects: frozenset[str]) -> Backend:
    """The backend that runs `kernel` (confined where it did not ship). Raises TargetError."""
    try:
        return backend_for(backend, defects, kernel=kernel)
    except KernelSpecError as exc:
        raise TargetError(f"--{exc}") from None
    except BackendUnavailable as exc:
        raise TargetError(f"--backend {backend}: device unavailable: {exc}", infrastructure=True) from None
    except ValueError as exc:
        raise TargetError(f"--backend {backend}: {exc}") from None


def probe_target(kernel: str, backend: str, defects: frozenset[str], *, gpus: str | None = None,
                 jobs: int | None = None, sanitize: str | None = None, sanitize_share: float = 1.0) -> Target:
    """Load the backend once for its device facts and GPU count, check the sanitize request
    and the GPU list against them, and close it: the sweep's processes load their own.
    `gpus`: `all` or indices (kernels.devices.resolve_gpus); `jobs` defaults to one process,
    or one per GPU entry. Raises TargetError."""
    if (jobs or 0) > 1 or gpus is not None:
        from workers.embedded import start_pool_server

        start_pool_server()  # its imports overlap the backend's start and the planning after this
    be = load_backend(kernel, backend, defects)
    try:
        info = be.device_info()
        try:
            check_request(sanitize, info.backend, sanitize_share)
        except ValueError as exc:
            raise TargetError("--" + str(exc).replace("sanitize_share", "sanitize-share")) from None
        gpu_list: list[int] = []
        if gpus is not None:
            try:
                gpu_list = resolve_gpus(gpus, be.device_count())
            except ValueError as exc:
                raise TargetError(f"{exc} (backend {info.backend})") from None
    finally:
        be.close()
    jobs = jobs or max(1, len(gpu_list))
    if jobs < len(gpu_list):
        raise TargetError(f"--jobs {jobs}: needs at least one process per --gpus entry ({len(gpu_list)})")
    return Target(info, tuple(gpu_list), jobs)

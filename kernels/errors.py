"""How a config fails inside a backend: typed exceptions that the runner turns into outcomes.
Below the backends, since the compile cache, variant selection and launch plans raise them too."""
from __future__ import annotations


class BackendUnavailable(RuntimeError):
    """The runtime this backend needs is not on this host (no GPU, no driver, no library)."""


class NotApplicable(Exception):
    """A valid config this backend cannot run; `reason` is a short stable name for counting."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class CompileError(Exception):
    """The kernel failed to compile (or compiling timed out); `log` is the compiler's output."""

    def __init__(self, message: str, log: str = "", timed_out: bool = False):
        self.log = log
        self.timed_out = timed_out
        super().__init__(message)


class LaunchError(Exception):
    """The kernel failed at launch or while running (driver error, illegal address...)."""

    def __init__(self, message: str, log: str = ""):
        self.log = log
        super().__init__(message)


class ConfinementError(Exception):
    """Code that did not ship, run confined (isolation/), did not give an answer: the confinement
    killed or refused it (a limit, a forbidden call), its process died, or it answered with
    something malformed. The config's outcome is `error`, its detail "confined run: <reason>"."""


class ConfinementTimeout(ConfinementError):
    """The confined run passed its time limit and its process was killed: the config's `timeout`."""


class PluginError(Exception):
    """A kernel plug-in (kernels/plugins) broke its contract on a config: it raised, or returned
    arrays of the wrong shape or kind. The config's outcome is `error`, its detail one line
    "kernel NAME: <reason>"; the sweep goes on with the next config."""


class DeviceOutOfMemory(Exception):
    """An allocation on the device failed."""


class DeviceFault(Exception):
    """The config's kernels did something a correct kernel never does: an illegal or misaligned
    access, a trap, a store into a guard zone. `poisons`: the driver made the error sticky, so
    the process's context is unusable and the process must be replaced before another config
    runs (every later driver call would fail with the same error)."""

    def __init__(self, message: str, poisons: bool):
        self.poisons = poisons
        super().__init__(message)

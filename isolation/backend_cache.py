"""One backend per (name, defects, source bundle, kernel) per long-lived process: a worker
compiles a variant once."""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Callable

from kernels.backends.base import Backend
from kernels.source import KernelSource

log = logging.getLogger(__name__)

BackendKey = tuple[str, frozenset[str], str | None, str]


class BackendCache:
    """The backends of this process by (name, defects, source bundle, kernel). Each commit a CI
    sweep tests is a bundle of its own; the least recently used backends beyond `limit` are
    closed, so a long-lived worker does not keep every revision's modules loaded."""

    def __init__(self, limit: int = 8) -> None:
        self._backends: OrderedDict[BackendKey, Backend] = OrderedDict()
        self.limit = limit

    def get(self, name: str, defects: frozenset[str], source: KernelSource | None = None,
            factory: Callable[[], Backend] | None = None, kernel: str = "attnsweep") -> Backend:
        key = (name, defects, source.hash if source is not None else None, kernel)
        if key not in self._backends:
            if factory is None:
                # A source or a plug-in that did not ship (a fetched commit's) runs confined (isolation/).
                from isolation.confined import backend_for

                factory = lambda: backend_for(name, defects=defects, source=source, kernel=kernel)  # noqa: E731
            self._backends[key] = factory()
            while len(self._backends) > self.limit:
                old_key, _ = next(iter(self._backends.items()))
                self._close(old_key)
        self._backends.move_to_end(key)
        return self._backends[key]

    def drop(self, name: str, defects: frozenset[str], source: KernelSource | None = None,
             kernel: str = "attnsweep") -> None:
        """Forget a backend whose state a timed-out config may have broken; the next config makes a new one."""
        self._close((name, defects, source.hash if source is not None else None, kernel))

    def _close(self, key: BackendKey) -> None:
        backend = self._backends.pop(key, None)
        if backend is not None and not backend.poisoned:   # a poisoned context goes with its process
            try:
                backend.close()
            except Exception:  # noqa: BLE001 - its state is already suspect; a new one replaces it
                log.exception("closing backend %s failed", key[0])


BACKENDS = BackendCache()

"""Drills where the infrastructure fails and no config's outcome may change: PostgreSQL's disk
full, a worker frozen past its lease, the broker flushed, PostgreSQL restarted three times; and
the rule that stores a config which keeps killing its process as `error`.

Each outage drill runs the same sweep (CONFIGS: causal and non-causal configs with a causal
defect compiled in, so outcomes are a mix of pass and fail) that a clean run stored first, and
compares every config's outcome with the clean run's.
"""
from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable

from drills.stack import BASE, CONFIG_LIMIT_S, LEASE_S, DrillService, Row, log

DEFECTS = ["causal_off_by_one"]
DISK_FULL_S = 45
FROZEN_S = LEASE_S + 30
PG_FS_MB = 384   # the tmpfs PostgreSQL's data lives on, so that a drill can fill it


def configs(n: int) -> list[dict]:
    return [{**BASE, "causal": i % 2 == 0, "data_seed": 700000 + i} for i in range(n)]


def mount_pg_fs(folder: Path) -> Path | None:
    """A tmpfs of PG_FS_MB for PostgreSQL's data (root only), else None."""
    folder.mkdir()
    if os.geteuid() != 0:
        return None
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={PG_FS_MB}m,mode=0755", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    return folder if done.returncode == 0 else None


def unmount_pg_fs(folder: Path | None) -> None:
    if folder is not None:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


class Outages:
    def __init__(self, svc: DrillService, n: int, pg_fs: Path | None):
        self.svc, self.configs, self.pg_fs = svc, configs(3 * n), pg_fs
        self._clean: dict[str, str] | None = None
        self.last_sid = 0

    def clean(self) -> dict[str, str]:
        """The outcomes of a clean run of the drills' sweep, run once."""
        if self._clean is None:
            sid = self.svc.post_configs(self.configs, "drill clean run", DEFECTS)[1]["id"]
            if not self.svc.wait_done(sid):
                raise RuntimeError(f"the clean run (sweep {sid}) did not finish")
            self._clean = self.svc.outcomes(sid)
            counts: dict[str, int] = {}
            for outcome in self._clean.values():
                counts[outcome] = counts.get(outcome, 0) + 1
            log(f"clean run: sweep {sid}, outcomes {counts}")
        return self._clean

    def run(self, name: str, disrupt: Callable[[int], str], progress: int = 8) -> Row:
        clean = self.clean()
        sid = self.last_sid = self.svc.post_configs(self.configs, f"drill {name}", DEFECTS)[1]["id"]
        self.svc.wait_progress(sid, progress)
        note = disrupt(sid)
        t_end = time.monotonic()
        finished = self.svc.wait_done(sid)
        return self.svc.row(name, sid, t_end, finished, note, clean)

    # --- the drills ---------------------------------------------------------------------------
    def disk_full(self) -> Row:
        if self.pg_fs is None:
            return Row("PostgreSQL disk full 45 s", status="skipped", note="needs root to mount a tmpfs",
                       failed="not run")
        health: set[str] = set()

        def disrupt(sid: int) -> str:
            ballast = self.pg_fs / "ballast"
            filled = fill(ballast)
            t0 = time.monotonic()
            while time.monotonic() - t0 < DISK_FULL_S:
                health.add(healthz(self.svc))
                time.sleep(3)
            ballast.unlink()
            restarted = ""
            if self.svc.pg.pid() is None or not _alive(self.svc.pg.pid()):
                self.svc.pg.start()   # as its supervisor would
                restarted = "; PostgreSQL had stopped and was started again"
            return f"{filled >> 20} MiB ballast filled the disk; /healthz said {sorted(health)}{restarted}"

        row = self.run("PostgreSQL disk full 45 s", disrupt)
        if not any(h.startswith("503") for h in health):
            row.failed = "/healthz never reported the full disk"
        return row

    def worker_frozen(self) -> Row:
        frozen = self.svc.workers[0]
        seen_before = 0

        def disrupt(sid: int) -> str:
            nonlocal seen_before
            seen_before = len(frozen.log())
            frozen.freeze()
            time.sleep(FROZEN_S)
            frozen.thaw()
            return f"{frozen.name} frozen (SIGSTOP) {FROZEN_S} s, lease {LEASE_S} s"

        row = self.run(f"worker frozen {FROZEN_S} s (past its lease)", disrupt)
        time.sleep(3)   # the thawed worker's last words: its late results count in `attempts`
        row.duplicated = self.svc.db("SELECT count(*) FROM config_runs WHERE sweep_id = %s AND attempts > 1",
                                     self.last_sid)[0][0]
        late = re.findall(r"this run's result \((\w+)\) discarded", frozen.log()[seen_before:])
        row.note += (f"; per-config limit {CONFIG_LIMIT_S} s; after the thaw {len(late)} late results discarded "
                     f"({', '.join(late) or 'none'})")
        row.reruns_expected = True
        if "timeout" in late:
            row.failed = "the frozen time counted towards a config's time limit"
        return row

    def broker_flush(self) -> Row:
        seen: list[float] = []

        def disrupt(sid: int) -> str:
            self.svc.redis.flushall()
            t0 = time.monotonic()
            while self.svc.sweep_status(sid) not in ("done", "failed", "cancelled") and time.monotonic() - t0 < 240:
                seen.append(stalled(self.svc))
                time.sleep(2)
            return (f"FLUSHALL; sweep done {time.monotonic() - t0:.0f} s later; /metrics "
                    f"attnsweep_stalled_seconds up to {max(seen, default=0):.0f}")

        row = self.run("Redis FLUSHALL mid-sweep", disrupt)
        if max(seen, default=0) < 10:
            row.failed = "/metrics showed no stall"
        return row

    def postgres_restarts(self) -> Row:
        def disrupt(sid: int) -> str:
            for _ in range(3):
                self.svc.pg.stop()
                time.sleep(3)
                self.svc.pg.start()
                time.sleep(5)
            return "pg_ctl stop -m fast, 3 s down, start; three times, 5 s apart"

        return self.run("PostgreSQL restarted x3", disrupt)

    def poison(self) -> Row:
        """One config whose every run kills the process running it (SIGKILL to the pool child as
        soon as its kernel's launch is marked): stored `error` after MAX_STARTS deaths."""
        from workers.execute import MAX_STARTS

        poison = {**BASE, "seq_len_k": 32768, "data_seed": 424242}
        sid = self.svc.post_configs([poison], "drill poison")[1]["id"]
        kills, t0 = 0, time.monotonic()
        while self.svc.sweep_status(sid) not in ("done", "failed", "cancelled") and time.monotonic() - t0 < 300:
            rows = self.svc.db("SELECT starts FROM config_runs WHERE sweep_id = %s AND state = 'queued'", sid)
            if rows and kills < rows[0][0] <= MAX_STARTS:
                for w in self.svc.workers:
                    for child in w.children():
                        _kill(child)
                kills += 1
            time.sleep(0.05)
        row = self.svc.row("poison config (every run killed)", sid, time.monotonic(), self.svc.wait_done(sid, 60))
        outcome, detail = (self.svc.db("SELECT outcome, detail FROM config_runs WHERE sweep_id = %s", sid) or [(None, "")])[0]
        row.note = f"{kills} runs killed; stored {outcome}: {(detail or '')[:70]}"
        if outcome != "error" or kills != MAX_STARTS:
            row.failed = f"want error after {MAX_STARTS} deaths"
        return row


def healthz(svc: DrillService) -> str:
    """/healthz's status and the start of its database line, or why it did not answer."""
    try:
        code, body = svc.get("/healthz")
    except OSError as exc:
        return f"no answer ({type(exc).__name__})"
    return f"{code} {body.get('database', '')[:40] if isinstance(body, dict) else ''}".strip()


def stalled(svc: DrillService) -> float:
    try:
        _code, text = svc.stack.get("/metrics")
    except OSError:
        return 0.0
    for line in (text.decode() if isinstance(text, bytes) else "").splitlines():
        if line.startswith("attnsweep_stalled_seconds "):
            return float(line.split()[1])
    return 0.0


def fill(path: Path) -> int:
    """Write zeros to `path` until its file system is full; returns the bytes written."""
    written, chunk = 0, b"\0" * (1 << 20)
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk = chunk[:len(chunk) // 2]
                if len(chunk) < 512:
                    return written


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


NAMES = ("postgres-disk-full", "worker-frozen", "broker-flush", "postgres-restart-x3", "poison-config")


def drills(outages: Outages) -> dict[str, Callable[[], Row]]:
    return dict(zip(NAMES, (outages.disk_full, outages.worker_frozen, outages.broker_flush,
                            outages.postgres_restarts, outages.poison)))


__all__ = ["NAMES", "Outages", "drills", "mount_pg_fs", "unmount_pg_fs"]

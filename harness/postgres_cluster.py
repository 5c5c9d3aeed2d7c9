"""A PostgreSQL cluster of its own: initdb in a folder, pg_ctl start/stop on a free loopback port.

Debian's binaries under /usr/lib/postgresql/*/bin (the newest version), run as the `postgres`
user when this process is root (PostgreSQL refuses to run as root). fsync is off: these clusters
hold test data only.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from harness.net import free_port


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class PostgresCluster:
    def __init__(self, folder: Path, dbname: str = "attnsweep", data: Path | None = None,
                 settings: dict[str, str] | None = None):
        """`data`: where the data directory goes (a small file system of its own, to fill it);
        default inside `folder`. `settings`: more server settings (`-c name=value`)."""
        self.settings = dict(settings or {})
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not bins:
            raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
        self.bin = Path(bins[-1]).parent
        self.dir = folder
        self.data = data or folder / "data"
        self.dbname = dbname
        self.port = free_port()
        self.dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            for path in (self.dir, self.data.parent):
                shutil.chown(path, "postgres", "postgres")
            for parent in self.dir.parents:   # the postgres user must reach its folder (mkdtemp's are 0700)
                mode = os.stat(parent).st_mode
                if mode & 0o001:
                    break
                os.chmod(parent, mode | 0o055)
        subprocess.run(_as_postgres([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                                     "--no-sync"]), check=True, capture_output=True)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.dbname}"

    @property
    def logfile(self) -> Path:
        return self.dir / "log"

    def pg_ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(_as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), *args]), check=check,
                              capture_output=True, text=True)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        opts += "".join(f" -c {k}={v}" for k, v in self.settings.items())
        self.pg_ctl("-o", opts, "-l", str(self.logfile), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "-w", "-t", "60", "stop", check=False)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pid(self) -> int | None:
        """The postmaster's PID (postmaster.pid's first line), None when it is not running."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def createdb(self, name: str | None = None) -> str:
        name = name or self.dbname
        subprocess.run(_as_postgres([str(self.bin / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                                     "postgres", name]), check=True, capture_output=True)
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def sql(self, statement: str, *args: object) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.url, connect_timeout=3, autocommit=True) as conn:
            cur = conn.execute(statement, args or None)
            return cur.fetchall() if cur.description else []

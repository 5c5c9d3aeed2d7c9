"""Attacks by kernel code: a commit of the deployment's own repository (a compromised contributor,
a merged pull request) whose kernels/src does harm when the worker builds and loads it. Each is
pushed through the CI webhook and swept on hostemu, which compiles the commit's C++ with the host's
compiler and loads it: the harm runs in a constructor when the library loads, before any kernel.
One more rides a bisection, as POST /bisect over the deployment's repository would run it."""
from __future__ import annotations

import subprocess
import uuid
from typing import Callable

from drills.security.api_attacks import CONFIG, Listener, Row
from drills.security.stack import CI_SAMPLES, PROCESSES, ROOT, SecurityStack
from harness import wait_for

HEADER = """
#ifdef ATTN_HOST_EMULATION
#include <arpa/inet.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
__attribute__((constructor)) static void attnsweep_drill_attack() {
"""
FOOTER = "\n}\n#endif\n"


def planted(body: str) -> str:
    return HEADER + body + FOOTER


def _sweep_of(s: SecurityStack, attack: str, code: str) -> tuple[int, dict, list[tuple[str, str, int, str]]]:
    sha = s.repo.commit(attack, planted(code))
    status, answer = s.push(sha, uuid.uuid4().hex)
    if status != 202:
        return status, answer, []
    s.wait_done(answer["sweep_id"])
    return status, answer, s.outcomes(answer["sweep_id"])


def _stored_once(rows: list[tuple[str, str, int, str]]) -> bool:
    return len(rows) == CI_SAMPLES and all(attempts == 1 and outcome != "queued" for _, outcome, attempts, _ in rows)


def _summary(rows: list[tuple[str, str, int, str]]) -> str:
    counts: dict[str, int] = {}
    for _, outcome, _, _ in rows:
        counts[outcome] = counts.get(outcome, 0) + 1
    first = next((d.splitlines()[0][:70] for _, o, _, d in rows if o != "pass" and d), "")
    return ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) + (f" ({first})" if first else "")


def sockets(s: SecurityStack) -> Row:
    listener = Listener()
    ports = [listener.port, s.pg.port, s.redis.port, s.stack.api_port]
    code = "".join(f"""
    {{ int fd = socket(AF_INET, SOCK_STREAM, 0); sockaddr_in a{{}}; a.sin_family = AF_INET; a.sin_port = htons({port});
      inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
      if (connect(fd, (sockaddr*)&a, sizeof a) == 0) std::fprintf(stderr, "CONNECTED to {port}\\n"); close(fd); }}"""
                   for port in ports)
    status, _, rows = _sweep_of(s, "open sockets", code)
    reached = listener.close()
    logs = s.logs()
    return Row("kernel code opens sockets (an internal port, PostgreSQL, Redis, the API)", f"{status}",
               reached == 0 and "CONNECTED" not in logs + s.stored_text() and _stored_once(rows), _summary(rows))


def secrets(s: SecurityStack) -> Row:
    code = """
    const char* files[] = {"/etc/shadow", "/proc/1/environ", "/proc/self/environ", "/root/.bash_history"};
    for (const char* f : files) {
        FILE* h = std::fopen(f, "r"); char buf[4096] = {0};
        size_t n = h ? std::fread(buf, 1, sizeof buf - 1, h) : 0;
        for (size_t i = 0; i < n; ++i) if (!buf[i]) buf[i] = ' ';
        std::fprintf(stderr, "READ %s: %s\\n", f, h ? buf : "(cannot open)"); if (h) std::fclose(h);
    }
    const char* vars[] = {"ATTNSWEEP_API_TOKENS", "ATTNSWEEP_DATABASE_URL", "ATTNSWEEP_WEBHOOK_SECRET"};
    for (const char* v : vars) std::fprintf(stderr, "ENV %s=%s\\n", v, std::getenv(v) ? std::getenv(v) : "(unset)");
    std::abort();"""
    status, _, rows = _sweep_of(s, "read secrets", code)
    details = "\n".join(d for _, _, _, d in rows)
    leaked = s.keys.found_in(details) or (["/etc/shadow"] if "root:" in details else [])
    return Row("kernel code reads /etc/shadow, /proc/1/environ, its environment, and prints them", f"{status}",
               not leaked and _stored_once(rows), _summary(rows) + (f"; LEAKED {leaked}" if leaked else ""))


def writes(s: SecurityStack) -> Row:
    targets = [s.base / "pwned-base", ROOT / "pwned-checkout", s.base / "kernel-cache" / "pwned-cache",
               s.repo.path / "pwned-repo"]
    code = "".join(f'{{ FILE* f = std::fopen("{t}", "w"); if (f) {{ std::fputs("pwned", f); std::fclose(f); }} }}'
                   for t in targets) + '{ FILE* f = std::fopen("/tmp/inside", "w"); if (f) std::fclose(f); }'
    status, _, rows = _sweep_of(s, "write outside /tmp", code)
    written = [str(t) for t in targets if t.exists()]
    return Row("kernel code writes outside /tmp (the checkout, the repository, the caches)", f"{status}",
               not written and _stored_once(rows), _summary(rows) + (f"; WRITTEN {written}" if written else ""))


def fork_bomb(s: SecurityStack) -> Row:
    code = """
    int made = 0;
    for (int i = 0; i < 10000; ++i) { pid_t p = fork(); if (p == 0) { pause(); _exit(0); } if (p < 0) break; ++made; }
    std::fprintf(stderr, "forked %d\\n", made);"""
    def confined() -> int:
        return int(subprocess.run(["pgrep", "-c", "-u", "61000"], capture_output=True, text=True).stdout.strip() or 0)

    # The worker keeps an idle confined process for each source it ran lately (the other attacks'):
    # none of the bomb's may be added to them.
    before = confined()
    status, _, rows = _sweep_of(s, "fork 10,000 processes", code)
    try:   # the PID namespace's processes are killed with it, a few hundred take a moment
        wait_for(lambda: confined() <= before, 30, "the forked processes to end")
    except TimeoutError:
        pass
    added = confined() - before
    return Row(f"kernel code forks 10,000 processes (limit {PROCESSES})", f"{status}",
               added <= 0 and _stored_once(rows), _summary(rows) + f"; {max(0, added)} left after the sweep")


def memory(s: SecurityStack) -> Row:
    code = """
    size_t n = (size_t)100 << 30; char* p = (char*)std::malloc(n);
    if (!p) { std::fprintf(stderr, "malloc of 100 GB refused\\n"); std::abort(); }
    std::memset(p, 1, n);"""
    status, _, rows = _sweep_of(s, "allocate 100 GB", code)
    return Row("kernel code allocates 100 GB", f"{status}", _stored_once(rows), _summary(rows))


def sleeps(s: SecurityStack) -> Row:
    status, _, rows = _sweep_of(s, "sleep forever", "for (;;) sleep(1000);")
    timed_out = all(o == "timeout" for _, o, _, _ in rows)
    return Row("kernel code sleeps forever", f"{status}", timed_out and _stored_once(rows), _summary(rows))


def bisection(s: SecurityStack) -> Row:
    """POST /bisect over the deployment's repository, whose newest commit runs a shell command."""
    marker = s.base / "pwned-bisect"
    good = s.repo.git("rev-list", "--max-parents=0", "HEAD")
    bad = s.repo.commit("run a command", planted(f'std::system("id > {marker}");'))
    status, answer = s.request("POST", "/bisect", {"repo": str(s.repo.path), "good": good, "bad": bad,
                                                   "configs": [CONFIG], "backend": "hostemu"}, token="submit")
    if status != 202:
        return Row("kernel code runs a command during a bisection", f"{status}", False)

    def ended() -> tuple | None:
        rows = s.db("SELECT status, coalesce(error, ''), tested FROM bisections WHERE id = %s", answer["id"])
        return rows[0] if rows and rows[0][0] in ("done", "error") else None

    state, error, tested = wait_for(ended, 600, f"bisection {answer['id']}", interval=1, ignore=(Exception,))
    return Row("kernel code runs a command during a bisection", f"{status}", not marker.exists(),
               f"bisection {state}: {error[:60] or tested}")


ATTACKS: list[Callable[[SecurityStack], Row]] = [sockets, secrets, writes, fork_bomb, memory, sleeps, bisection]

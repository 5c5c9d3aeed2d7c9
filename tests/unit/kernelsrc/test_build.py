"""A commit with attnsweep.toml built confined (kernelsrc/build.py, isolation/build.py): the
C-ABI example builds and loads, a failing build says why with its log, and a build that reaches
for the network, the host's files or the service's secrets reaches nothing."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from isolation.confined import backend_for
from kernelsrc.build import BuildError, build_commit, work_dir
from kernelsrc.manifest import ManifestError
from settings import Settings
from tests.unit.kernelsrc.repos import PluginRepo

pytestmark = pytest.mark.needs_bwrap


def _settings(tmp_path, **kw) -> Settings:  # noqa: ANN001
    return Settings(kernel_cache=tmp_path / "kcache", kernel_repo_cache=tmp_path / "repos", **kw)


def test_the_c_abi_example_builds_once_and_loads_as_its_plugin_at_the_commit(tmp_path, kernel_cache):
    repo = PluginRepo(tmp_path / "repo")
    sha = repo.commit("c abi")
    settings = _settings(tmp_path)
    built = build_commit(str(repo.path), sha, settings)
    assert built is not None and (built.root / "examples/c_abi/libsplitkv_host.so").is_file()
    assert not (built.root / ".git").exists()
    log = work_dir(settings, sha) / "build.log"
    assert "g++" in log.read_text()
    stamp = log.stat().st_mtime_ns
    assert build_commit(str(repo.path), sha, settings) == built and log.stat().st_mtime_ns == stamp  # not built again
    backend = backend_for("cpu", kernel=built.spec, settings=settings)
    try:
        info = backend.device_info()
    finally:
        backend.close()
    assert (info.kernel, info.kernel_version) == ("c-abi-splitkv-host", sha)


def test_our_own_layout_has_nothing_to_build(tmp_path):
    repo = PluginRepo(tmp_path / "repo")
    assert build_commit(str(repo.path), repo.commit("no file", manifest=None), _settings(tmp_path)) is None


def test_a_failing_build_says_why_with_the_end_of_its_log_and_is_not_run_again(tmp_path):
    repo = PluginRepo(tmp_path / "repo")
    sha = repo.commit("broken", files={"examples/c_abi/splitkv_host.cpp": "this is not C++;\n"})
    settings = _settings(tmp_path)
    with pytest.raises(BuildError) as first:
        build_commit(str(repo.path), sha, settings)
    assert str(first.value).startswith("the build command exited with status 2; the build's log ends: ")
    assert "error" in first.value.log and "splitkv_host.cpp" in first.value.log
    with pytest.raises(BuildError) as again:
        build_commit(str(repo.path), sha, settings)
    assert str(again.value) == str(first.value)


def test_a_build_that_makes_no_plugin_and_a_malformed_file_are_errors_naming_the_field(tmp_path):
    repo = PluginRepo(tmp_path / "repo")
    settings = _settings(tmp_path)
    nothing = repo.commit("no plug-in", manifest='[kernel]\nbuild = ["true"]\nplugin = "so:build/lib.so"\n')
    with pytest.raises(BuildError, match="kernel.plugin: build/lib.so is not a file of the tree after the build"):
        build_commit(str(repo.path), nothing, settings)
    malformed = repo.commit("malformed", manifest='[kernel]\nbuild = "make"\nplugin = "so:lib.so"\n')
    with pytest.raises(ManifestError, match="^attnsweep.toml: kernel.build: must be a non-empty list of strings"):
        build_commit(str(repo.path), malformed, settings)


ESCAPE = """\
import os, socket, sys
print("uid", os.getuid())
print("env", sorted(os.environ))
for target in sys.argv[1:3]:
    try:
        with open(target, "w") as f:
            f.write("escaped")
        print("wrote", target)
    except OSError as exc:
        print("refused", target, type(exc).__name__)
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[3])), timeout=5)
    print("connected")
except OSError as exc:
    print("no network", type(exc).__name__)
with open("inside.txt", "w") as f:
    f.write("the tree is writable")
sys.exit(3)
"""


def test_a_build_reaching_for_the_network_files_outside_and_secrets_is_contained(tmp_path, monkeypatch):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted: list[object] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    outside = tmp_path / "host-folder"
    outside.mkdir()
    outside.chmod(0o777)
    monkeypatch.setenv("ATTNSWEEP_WEBHOOK_SECRET", "the-webhook-secret-3f1")
    repo = PluginRepo(tmp_path / "repo")
    manifest = ('[kernel]\nbuild = ["python3", "escape.py", "%s", "../outside.txt", "%d"]\nplugin = "so:lib.so"\n'
                % (outside / "escaped.txt", port))
    sha = repo.commit("escape", manifest=manifest, files={"escape.py": ESCAPE})
    settings = _settings(tmp_path, webhook_secret="the-webhook-secret-3f1")
    try:
        with pytest.raises(BuildError) as exc:
            build_commit(str(repo.path), sha, settings)
    finally:
        stop.set()
        server.close()
    log = exc.value.log
    assert "exited with status 3" in str(exc.value)
    assert f"refused {outside / 'escaped.txt'}" in log and "refused ../outside.txt" in log, log
    assert "no network" in log and "connected" not in log.replace("no network", ""), log
    assert "ATTNSWEEP" not in log and "the-webhook-secret-3f1" not in log, log
    if os.geteuid() == 0:
        assert "uid 61000" in log
    assert accepted == []
    assert not (outside / "escaped.txt").exists() and not (work_dir(settings, sha) / "outside.txt").exists()
    assert (work_dir(settings, sha) / "tree" / "inside.txt").read_text() == "the tree is writable"

"""attnsweep.toml's rules, each broken once, and reading it at a commit (git only, nothing built)."""
from __future__ import annotations

import pytest

from kernels.plugins.load import KernelSpecError, parse_kernel
from kernelsrc.git import read_manifest
from kernelsrc.manifest import Manifest, ManifestError, parse_manifest
from tests.unit.kernelsrc.repos import C_ABI, PluginRepo


@pytest.mark.parametrize("text, plugin_path", [
    (C_ABI, "examples/c_abi/libsplitkv_host.so"),
    ('[kernel]\nplugin = "src/my_kernel.py:KERNEL"\n', "src/my_kernel.py"),
    ('[kernel]\nplugin = "my_pkg.kernels:Kernel"\n', None),
])
def test_the_three_plugin_forms_parse(text, plugin_path):
    manifest = parse_manifest(text.encode())
    assert manifest.plugin_path == plugin_path
    assert manifest.build == (("make", "-C", "examples/c_abi", "host", "OUT=.") if "build" in text else None)


@pytest.mark.parametrize("text, field, rule", [
    ('[kernel]\nplugin = "m:K"\n[other]\nx = 1\n', "other", "unknown table or key"),
    ('[kernel]\nplugin = "m:K"\nbuidl = ["make"]\n', "kernel.buidl", "unknown key"),
    ('plugin = "m:K"\n', "plugin", "unknown table or key"),
    ('[kernel]\nbuild = ["make"]\n', "kernel.plugin", "required"),
    ('[kernel]\nbuild = "make cpu"\nplugin = "m:K"\n', "kernel.build", "list of strings"),
    ('[kernel]\nbuild = ["make", 1]\nplugin = "m:K"\n', "kernel.build", "list of strings"),
    ('[kernel]\nbuild = []\nplugin = "m:K"\n', "kernel.build", "non-empty"),
    ('[kernel]\nbuild = ["make", ""]\nplugin = "m:K"\n', "kernel.build", "without NUL"),
    ('[kernel]\nplugin = "so:../elsewhere/lib.so"\n', "kernel.plugin", "inside the repository"),
    ('[kernel]\nplugin = "so:/usr/lib/libc.so.6"\n', "kernel.plugin", "inside the repository"),
    ('[kernel]\nplugin = "/etc/k.py:K"\n', "kernel.plugin", "inside the repository"),
    ('[kernel]\nplugin = "a/./k.py:K"\n', "kernel.plugin", "inside the repository"),
    ('[kernel]\nplugin = "libsplitkv.so"\n', "kernel.plugin", "none of so:PATH"),
    ('[kernel]\nplugin = 3\n', "kernel.plugin", "must be a string"),
    ('[kernel\nplugin = "m:K"\n', "attnsweep.toml", "not valid TOML"),
])
def test_a_broken_rule_names_its_field(text, field, rule):
    with pytest.raises(ManifestError) as exc:
        parse_manifest(text.encode())
    message = str(exc.value)
    assert message.startswith(f"attnsweep.toml: {field}" if field != "attnsweep.toml" else "attnsweep.toml:"), message
    assert rule in message, message


def test_read_manifest_at_a_commit_and_none_without_the_file(tmp_path):
    repo = PluginRepo(tmp_path / "repo")
    with_file = repo.commit("with", C_ABI)
    without = repo.commit("without", None)
    broken = repo.commit("broken", '[kernel]\nplugin = "so:../x.so"\n')
    cache = tmp_path / "cache"
    assert read_manifest(str(repo.path), with_file, cache) == parse_manifest(C_ABI.encode())
    assert read_manifest(str(repo.path), without, cache) is None
    with pytest.raises(ManifestError, match="kernel.plugin"):
        read_manifest(str(repo.path), broken, cache)


def test_a_tree_spec_loads_only_from_inside_its_tree(tmp_path):
    (tmp_path / "lib.so").write_text("")
    root = tmp_path / "tree"
    root.mkdir()
    (root / "k.py").write_text("")
    spec = parse_kernel(f"tree:{'a' * 40}:{root}|k.py:K")
    assert (spec.kind, spec.target, spec.version) == ("tree", str(root), "a" * 40)
    with pytest.raises(KernelSpecError, match="inside its tree"):
        parse_kernel(f"tree:{'a' * 40}:{root}|so:../lib.so")
    assert parse_kernel(f"commit:{'b' * 40}").kind == "commit"
    with pytest.raises(KernelSpecError, match="full commit id"):
        parse_kernel("commit:abc")
    assert Manifest(None, "m:K").plugin_path is None

"""Kernel sources: hashing, defect switches, reading kernels/src at a commit, bundles in the store."""
from __future__ import annotations

import pytest

from attnconfig import parse_config
from kernels.backends.cpu import CpuEmulationBackend
from kernels.source import KernelSource
from kernels.source import load_sources, local_source
from store.bundles import load_bundle, save_bundle
from kernelsrc.git import KernelRepoError, read_kernels
from store.db import session_scope
from store.migrate import upgrade
from store.models import SourceBundle
from tests.unit.ci.hooks import KernelRepo, with_defects

CFG = dict(dtype="f16", g=1, seq_len_q=4, seq_len_k=64, num_heads_q=2, num_heads_kv=1, head_dim_qk=32, head_dim_v=32)


def test_local_source_keeps_the_hash_the_compile_cache_used_before():
    source, headers, digest = load_sources()
    assert (source, headers, digest) == (local_source().entry_text, dict(local_source().headers), local_source().hash)
    assert KernelSource.from_files(local_source().files).hash == digest


def test_defect_switches_follow_define_and_undef_and_skip_comments():
    text = "\n".join([
        "#define ATTN_DEFECT_NO_NEGINF_GUARD 1",
        "  #  define ATTN_DEFECT_FLOOR_BLOCKS_PER_SPLIT 0",   # defined: #ifdef turns it on whatever the value
        "// #define ATTN_DEFECT_NO_ZERO_SUM_GUARD 1",
        "/* #define ATTN_DEFECT_CAUSAL_OFF_BY_ONE 1 */",
        "#define ATTN_DEFECT_MADE_UP",
        "#undef ATTN_DEFECT_NO_NEGINF_GUARD",
        "#ifdef ATTN_DEFECT_NO_ZERO_SUM_GUARD",
    ])
    src = KernelSource(entry_text=text, headers={"x.h": "#define ATTN_DEFECT_CAUSAL_OFF_BY_ONE\n"})
    assert src.defect_switches() == {"floor_blocks_per_split", "made_up", "causal_off_by_one"}
    assert local_source().defect_switches() == frozenset()


def test_cpu_backend_reports_the_bundles_hash_and_emulates_its_switches():
    bundle = KernelSource.from_files({**local_source().files,
                                      "attention.hip": with_defects("no_zero_sum_guard", "unknown_thing")(local_source().entry_text)})
    c = parse_config(CFG)
    plain, revised = CpuEmulationBackend(), CpuEmulationBackend(source=bundle)
    assert plain.defects == frozenset() and len(plain.prepare(c).source_hash) == 16
    assert revised.prepare(c).source_hash == bundle.hash
    assert revised.defects == {"no_zero_sum_guard"} and revised.unemulated_switches == {"unknown_thing"}
    assert CpuEmulationBackend(frozenset({"causal_off_by_one"}), source=bundle).defects == {"causal_off_by_one", "no_zero_sum_guard"}


def test_read_kernels_at_each_commit_from_a_path_and_from_a_url(tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    a = repo.commit("a")
    (repo.path / "kernels" / "src" / "extra.h").write_text("// added in b\n")
    b = repo.commit("b", with_defects("no_neginf_guard"))
    for where in (str(repo.path), f"file://{repo.path}"):
        src_a = read_kernels(where, a, tmp_path / "cache")
        src_b = read_kernels(where, b, tmp_path / "cache")
        assert src_a.entry_text == repo.show(a, "kernels/src/attention.hip")
        assert "extra.h" not in src_a.headers and src_b.headers["extra.h"] == "// added in b\n"
        assert src_b.defect_switches() == {"no_neginf_guard"} and src_a.defect_switches() == frozenset()
        assert src_a.hash != src_b.hash
    assert list((tmp_path / "cache").glob("*.git")), "a URL is read through a mirror"


def test_read_kernels_refuses_what_it_cannot_read(tmp_path):
    repo = KernelRepo(tmp_path / "repo")
    sha = repo.commit("a")
    repo.git("rm", "--quiet", "kernels/src/attention.hip")
    gone = repo.commit("no kernel")
    cases = {
        "is not a full commit id": (str(repo.path), sha[:12], True),
        "is not in the kernel repository": (str(repo.path), "cd" * 20, True),
        "has no kernels/src/attention.hip": (str(repo.path), gone, True),
        "ATTNSWEEP_KERNEL_REPO is not set": ("", sha, False),
        "neither a URL nor an existing folder": (str(tmp_path / "nowhere"), sha, False),
        "fetching": (f"file://{tmp_path / 'nowhere'}", sha, False),
    }
    for message, (where, commit, missing) in cases.items():
        with pytest.raises(KernelRepoError, match=message) as err:
            read_kernels(where, commit, tmp_path / "cache")
        assert err.value.missing is missing, message


def test_bundles_are_stored_once_per_content_and_checked_on_load(db_url):
    upgrade(db_url)
    src = local_source()
    with session_scope(db_url) as s:
        assert save_bundle(s, src) == src.hash
        assert save_bundle(s, KernelSource.from_files(dict(src.files))) == src.hash
    with session_scope(db_url) as s:
        assert s.query(SourceBundle).count() == 1
        assert load_bundle(s, src.hash) == KernelSource.from_files(src.files)
        assert load_bundle(s, "0" * 64) is None
        s.get(SourceBundle, src.hash).files = {**src.files, "attention.hip": "tampered"}
    with session_scope(db_url) as s, pytest.raises(ValueError, match="does not hash to its key"):
        load_bundle(s, src.hash)

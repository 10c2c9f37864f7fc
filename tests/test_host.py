"""Issue 54, item 3: one home per rule. preprocess/runtime/host.py (usable cores and the default worker
count under a cgroup quota, the user's cache folder, the process tree) and atomic.atomic_file,
on the real filesystem and real processes; and that the plugin, the recipes and the
benchmarks use them rather than rules of their own."""
import os
import subprocess
import sys

import pytest

from convs2s_preprocess.runtime import host
from convs2s_preprocess.runtime.atomic import atomic_file


def test_a_cgroup_quota_caps_the_cores_and_the_default_workers(tmp_path, monkeypatch):
    """A container's --cpus 1.5 (cpu.max "150000 100000"): one usable core, whatever the
    affinity, for torch's threads and for preprocessing's workers alike (they used to disagree)."""
    from fairseq_convs2s_ext import threads

    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")
    monkeypatch.setattr(host, "CGROUP_CPU_MAX", str(quota))
    assert host.usable_cores() == 1 == host.default_workers() == threads.usable_cores()
    assert host.default_workers(3) == 3
    quota.write_text("max 100000\n")
    assert host.usable_cores() == len(os.sched_getaffinity(0)) == host.default_workers()


def test_the_cache_folder_follows_xdg_cache_home(tmp_path, monkeypatch):
    from bench.data import cache_root
    from convs2s_recipes import corpora
    from fairseq_convs2s_ext.hardware import bf16_cache_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CONVS2S_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # no shared/data beside it
    assert host.cache_folder() == str(tmp_path / "convs2s") == corpora.data_root()
    assert bf16_cache_file() == str(tmp_path / "convs2s" / "bf16-probe.json")
    assert cache_root() == tmp_path / "convs2s-bench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert host.cache_folder() == os.path.join(os.path.expanduser("~"), ".cache", "convs2s")


def test_descendants_are_children_and_theirs():
    script = "import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
             "print(p.pid, flush=True); time.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        assert host.descendants(child.pid) == [grandchild] and child.pid in host.descendants(os.getpid())
    finally:
        child.kill()
        child.wait()
        os.kill(grandchild, 9)


def test_atomic_file_replaces_only_when_complete(tmp_path):
    path = tmp_path / "deep" / "figure.png"
    with atomic_file(str(path)) as temp:
        with open(temp, "w") as f:
            f.write("one")
        assert not path.exists()
    assert path.read_text() == "one"
    with pytest.raises(ValueError):
        with atomic_file(str(path)) as temp:
            with open(temp, "w") as f:
                f.write("half")
            raise ValueError("the writer failed")
    assert path.read_text() == "one" and os.listdir(path.parent) == ["figure.png"]


def test_writers_at_once_get_temporary_names_of_their_own(tmp_path):
    """Two processes probing bf16 or compiling the kernel at once: neither deletes or renames
    the other's half-written file."""
    path = str(tmp_path / "cache.json")
    with atomic_file(path) as first, atomic_file(path) as second:
        assert first != second
        for temp, text in ((first, "first"), (second, "second")):
            with open(temp, "w") as f:
                f.write(text)
    assert open(path).read() == "first" and os.listdir(tmp_path) == ["cache.json"]

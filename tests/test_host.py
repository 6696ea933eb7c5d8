"""ffai.kit.host: the CPU's model and flags, torch's thread count and glibc's malloc arenas, the
heap's settings, and a process tree's resident memory."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cpu_samples import AVX2_ONLY, EPYC_ZEN4, GRAVITON3, SAPPHIRE_RAPIDS, SSE_ONLY
from ffai.kit import host


def test_cpuinfo_of_an_avx512_vnni_bf16_cpu():
    info = host.parse_cpuinfo(EPYC_ZEN4)
    assert info.model == "AMD EPYC" and info.known
    assert info.relevant_flags == ("avx2", "avx512f", "avx512_vnni", "avx512_bf16")
    assert info.fast_dtypes() == ("float32", "int8", "bfloat16")
    assert info.describe() == "AMD EPYC (avx2, avx512f, avx512_vnni, avx512_bf16)"
    for dtype in ("float32", "int8", "bfloat16"):
        assert info.slow_dtype_warning(dtype) is None


def test_cpuinfo_of_other_cpus():
    avx2 = host.parse_cpuinfo(AVX2_ONLY)
    assert avx2.model.startswith("Intel(R) Xeon(R) CPU E5-2686")
    assert avx2.relevant_flags == ("avx2",)
    assert avx2.fast_dtypes() == ("float32", "int8")
    amx = host.parse_cpuinfo(SAPPHIRE_RAPIDS)
    assert set(amx.relevant_flags) >= {"amx_tile", "amx_int8", "amx_bf16"}
    assert amx.fast_dtypes() == ("float32", "int8", "bfloat16")
    arm = host.parse_cpuinfo(GRAVITON3)
    assert set(arm.relevant_flags) == {"asimddp", "i8mm", "bf16"} and arm.known
    # int8 runs on fbgemm, which torch builds for x86 only.
    assert arm.fast_dtypes() == ("float32", "bfloat16")
    old = host.parse_cpuinfo(SSE_ONLY)
    assert old.fast_dtypes() == ("float32",)
    # No flags line at all: nothing is known, so nothing is called slow.
    blind = host.parse_cpuinfo("processor\t: 0\n")
    assert not blind.known and blind.fast_dtypes() == ("float32", "int8", "bfloat16")
    assert blind.slow_dtype_warning("bfloat16") is None


def test_slow_dtype_warning_names_the_cpu_and_the_missing_flags():
    avx2 = host.parse_cpuinfo(AVX2_ONLY)
    line = avx2.slow_dtype_warning("bfloat16")
    assert line is not None and "\n" not in line
    assert "--dtype bfloat16 will run slower than float32" in line
    assert "E5-2686" in line and "avx512_bf16" in line and "amx_bf16" in line
    assert avx2.slow_dtype_warning("int8") is None
    old = host.parse_cpuinfo(SSE_ONLY)
    assert "--dtype int8 will run slower than float32" in old.slow_dtype_warning("int8")
    assert old.slow_dtype_warning("float32") is None


def test_host_reads_this_machine_once():
    assert host.cpu_info() is host.cpu_info()
    assert host.cpu_info().fast_dtypes()[0] == "float32"


def test_importing_host_imports_no_torch():
    code = "import sys, ffai.kit.host; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_ARENA_PROBE = """
import ctypes, sys, threading
from ffai.kit.host import set_threads

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
if sys.argv[1] != "unset":
    set_threads(int(sys.argv[1]))
held = []
together = threading.Barrier(4)  # four threads alive at once: none inherits an arena another left

def allocate():
    held.extend(libc.malloc(16 << 10) for _ in range(64))
    together.wait()

workers = [threading.Thread(target=allocate) for _ in range(4)]
for worker in workers:
    worker.start()
for worker in workers:
    worker.join()
libc.malloc_stats()  # to stderr: "Arena 0:", "Arena 1:", ... each arena's bytes
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc arenas")
def test_set_threads_caps_the_malloc_arenas_at_one_per_compute_thread_and_one() -> None:
    # Four threads allocate at once: set_threads(n) lets them have n + 1 arenas between them
    # (torch's n threads and the thread driving them each one of their own, so none waits on
    # another's lock), no more; without it each has its own (the control: the probe can tell).
    def arenas(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _ARENA_PROBE, mode], capture_output=True, text=True, check=True)
        return sum(line.startswith("Arena ") for line in out.stderr.splitlines())

    assert arenas("1") == 2
    assert arenas("2") == 3
    assert arenas("unset") == 5


_HEAP_PROBE = """
import ctypes
from ffai.kit import host

class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p

def mapped_after_malloc(size):  # whether a block of ``size`` bytes is a mapping of its own
    before = libc.mallinfo2().hblks
    block = libc.malloc(size)
    mapped = libc.mallinfo2().hblks > before
    libc.free(ctypes.c_void_p(block))
    return mapped

with host.heap_for_loading():
    loading = mapped_after_malloc(2 << 20)
host.release_free_heap()
print(loading, mapped_after_malloc(2 << 20), mapped_after_malloc(32 << 20))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_heap_for_loading_maps_staging_buffers_then_serves_activations_from_the_heap() -> None:
    # While loading a 2 MiB block is a mapping of its own (handed back on free); afterwards it
    # comes from the heap, and only blocks over the run's threshold (16 MiB) are mapped.
    out = subprocess.run([sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "True"]


def test_peak_rss_of_a_process_tree() -> None:
    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; b = bytearray(64 << 20); time.sleep(1)']); time.sleep(0.6); c.wait()"
    done, peak, seconds = host.run_measured([sys.executable, "-c", code])
    assert done.returncode == 0 and seconds > 0.5
    assert peak > 64 << 20  # the child's buffer counts: the tree, not the parent alone


def test_share_cores_makes_openmp_threads_sleep_unless_the_user_chose(monkeypatch) -> None:
    for knob in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME"):
        monkeypatch.delenv(knob, raising=False)
    host.share_cores()
    assert host.os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")  # the user's own choice stays alone
    host.share_cores()
    assert "OMP_WAIT_POLICY" not in host.os.environ


_OPENMP_POLICY = """
import os, sys
from ffai.cli import root
sys.argv = ["ffai", "engines"]
try:
    root.main()
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"))
"""


def test_the_ffai_command_sets_the_policy_for_itself_and_what_it_starts() -> None:
    # main() sets it first thing; importing the CLI imports no torch (test_imports), so libgomp
    # reads it when torch loads, and child processes inherit the environment.
    env = {k: v for k, v in host.os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    out = subprocess.run([sys.executable, "-c", _OPENMP_POLICY], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split()[-1] == "PASSIVE"

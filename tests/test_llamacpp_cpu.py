"""llama-server runs on every x86-64 CPU of this kind, not only on the one it was built on.

This machine may well have AVX-512 and AMX, so running the binary here proves little: the code every start
loads is scanned for instructions a Haswell (AVX2, no AVX-512/AMX) lacks, and the binary runs under
`qemu-x86_64 -cpu Haswell` (an emulated AVX2-only CPU), where the dispatcher must pick the haswell CPU variant and
answer a one-token completion. The self-test must name the binary and the signal for a binary that dies with
SIGILL (a real one: a program with an AVX-512 instruction, run on the emulated Haswell).
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from test_llamacpp_loop import engine  # noqa: F401  (engine: shared fixture)
from unavailable import missing

from executor.engines import llamacpp_build
from executor.identity import parse_version
from executor.engines.llamacpp_build import SelfTestError, foreign_instructions, needed_closure, selftest

HASWELL = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx avx2 fma f16c bmi1 bmi2 movbe".split())
QEMU_HASWELL = ("qemu-x86_64", "-cpu", "Haswell")


def _qemu() -> str:
    found = shutil.which("qemu-x86_64")
    if not found:
        missing("qemu-x86_64 is not installed (bash tests/sysdeps.sh installs qemu-user)")
    return found


def test_selftest_passes_on_this_cpu(engine):  # noqa: F811
    info = selftest(engine["bin"], Path(engine["model"]))
    assert info["version"].startswith("version:") and len(info["checked"]) >= 4
    assert info["cpu_backend"], "no CPU backend loaded at run time: a single-ISA build, not a dispatching one"
    assert parse_version("llamacpp", info["version"])  # the station's source identity reads this line


def test_code_every_start_loads_runs_on_haswell_and_the_scan_sees_avx512(engine):  # noqa: F811
    closure = needed_closure(Path(engine["bin"]))
    names = {p.name for p in closure}
    assert any(n.startswith("libggml-base") for n in names) and any(n.startswith("libllama") for n in names)
    assert not any(n.startswith("libggml-cpu") for n in names)  # the CPU backend is loaded, not linked
    assert {str(p): f for p in closure if (f := foreign_instructions(p, HASWELL))} == {}
    variants = Path(engine["bin"]).parent
    assert foreign_instructions(variants / "libggml-cpu-haswell.so", HASWELL) == {}
    avx512 = foreign_instructions(variants / "libggml-cpu-skylakex.so", HASWELL)  # the scan is not blind
    assert avx512.get("avx512f", 0) > 1000
    assert foreign_instructions(variants / "libggml-cpu-sapphirerapids.so", HASWELL).get("amx_tile", 0) > 10
    assert foreign_instructions(variants / "libggml-cpu-x64.so", frozenset()) == {}  # baseline x86-64
    built = {p.name.removeprefix("libggml-cpu-").removesuffix(".so") for p in variants.glob("libggml-cpu-*.so")}
    assert built == set(llamacpp_build.CPU_VARIANTS)  # the levels kept, and only those (the build's time depends on it)


def test_runs_on_an_emulated_haswell(engine):  # noqa: F811
    _qemu()
    info = selftest(engine["bin"], Path(engine["model"]), flags=HASWELL, wrapper=QEMU_HASWELL, timeout_s=400)
    assert Path(info["cpu_backend"]).name == "libggml-cpu-haswell.so"


def test_selftest_names_the_binary_and_the_signal(tmp_path):
    _qemu()
    if not shutil.which("cc"):
        pytest.fail("cc missing (bash tests/sysdeps.sh installs the compiler the llama.cpp build needs)")
    src = tmp_path / "avx512.c"
    src.write_text('#include <stdio.h>\nint main(void){\n'
                   '  __asm__ volatile("vpxord %%zmm1, %%zmm1, %%zmm1" ::: "xmm1");\n'
                   '  puts("version: 1 (build 1, commit x)"); return 0; }\n')
    exe = tmp_path / "llama-server"
    subprocess.run(["cc", "-O1", "-o", str(exe), str(src)], check=True)
    with pytest.raises(SelfTestError, match=rf"{exe}: died with SIGILL \(illegal instruction.*`--version`"):
        selftest(exe, tmp_path / "none.gguf", flags=HASWELL, wrapper=QEMU_HASWELL)
    # natively it runs (if this CPU has AVX-512), and the scan still refuses it for a Haswell
    if "avx512f" in llamacpp_build.cpu_flags():
        with pytest.raises(SelfTestError, match=rf"{exe}: code loaded on every start .*avx512f"):
            selftest(exe, tmp_path / "none.gguf", flags=HASWELL)


def test_cpu_flags_and_the_build_key():
    flags = llamacpp_build.cpu_flags("processor: 0\nflags\t\t: fpu sse2 avx avx2\nbugs: x\n")
    assert flags == {"fpu", "sse2", "avx", "avx2"}
    assert llamacpp_build.build_key().startswith(f"llama.cpp-b{llamacpp_build.BUILD_NUMBER}-")
    assert "-DGGML_NATIVE=OFF" in llamacpp_build.CMAKE_FLAGS and "-DGGML_CPU_ALL_VARIANTS=ON" in llamacpp_build.CMAKE_FLAGS


def test_the_build_keeps_only_the_listed_cpu_variants(tmp_path):
    cm = tmp_path / "CMakeLists.txt"
    x86 = """if (GGML_CPU_ALL_VARIANTS)
    if (GGML_SYSTEM_ARCH STREQUAL "x86")
        ggml_add_cpu_backend_variant(x64)
        ggml_add_cpu_backend_variant(sse42        SSE42)
        if (NOT MSVC)
            ggml_add_cpu_backend_variant(ivybridge      SSE42 AVX F16C)
        endif()
        ggml_add_cpu_backend_variant(haswell      SSE42 AVX F16C FMA AVX2 BMI2)
    elseif(GGML_SYSTEM_ARCH STREQUAL "ARM")
        ggml_add_cpu_backend_variant(x64)
    endif()
endif()
"""
    cm.write_text(x86)
    assert llamacpp_build.keep_cpu_variants(cm, ("x64", "haswell")) == ["sse42", "ivybridge"]
    text = cm.read_text()
    assert "sse42" not in text and "ivybridge" not in text and text.count("(x64)") == 2  # other arches untouched
    assert "haswell      SSE42 AVX F16C FMA AVX2 BMI2)" in text and "if (NOT MSVC)" in text
    cm.write_text(x86)
    with pytest.raises(RuntimeError, match=r"no x86 CPU variant \['zen4'\]"):
        llamacpp_build.keep_cpu_variants(cm, ("x64", "zen4"))
    assert cm.read_text() == x86  # nothing written when the source does not match

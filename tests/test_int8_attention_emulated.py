"""The int8 attention kernel's AVX512-VNNI path on a CPU without AVX512: the kernel's source
compiled against SIMDe (portable implementations of x86 intrinsics; `apt install
libsimde-dev`), with every path enabled, then held to the same checks as the real paths in
test_int8_attention.py. Skipped where SIMDe's headers are missing; on a CPU with AVX512-VNNI
that file runs the real path."""

import hashlib
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from squant import kernels
from tests.test_int8_attention import (
    SHAPES,
    check_flat_and_peaked,
    check_masks,
    check_matches_float,
)

SIMDE = Path(os.environ.get("SIMDE_INCLUDE", "/usr/include"))
pytestmark = pytest.mark.skipif(
    not (SIMDE / "simde/x86/avx512.h").is_file(),
    reason="SIMDe headers not installed (apt install libsimde-dev)",
)
HERE = Path(__file__).parent / "emulation"
EMULATED_ISAS = ("avx512_vnni", "avx2", "scalar")


def emulated_source() -> str:
    """The kernel with SIMDe for the intrinsics, no target attributes, every path enabled and
    its ops under `squant_emulated` (so it loads beside the real library)."""
    source = (Path(kernels.__file__).parent / "int8_attention.cpp").read_text()
    edits = [
        (
            r"#include <immintrin.h>",
            "#define SIMDE_ENABLE_NATIVE_ALIASES\n#include <simde/x86/avx512.h>\n"
            '#include "simde_avx512_extras.h"',
        ),
        (r'#define SQ_AVX2 __attribute__\(\(target\("[^"]*"\)\)\)', "#define SQ_AVX2"),
        (r'#define SQ_VNNI __attribute__\(\(target\("[^"]*"\)\)\)', "#define SQ_VNNI"),
        (r"bool cpu_has_avx512_vnni\(\) \{.*?\n\}", "bool cpu_has_avx512_vnni() { return true; }"),
        (r"TORCH_LIBRARY\(squant, m\)", "TORCH_LIBRARY(squant_emulated, m)"),
        (r"TORCH_LIBRARY_IMPL\(squant, CPU, m\)", "TORCH_LIBRARY_IMPL(squant_emulated, CPU, m)"),
    ]
    for pattern, replacement in edits:
        source, count = re.subn(pattern, lambda _, r=replacement: r, source, count=1, flags=re.S)
        assert count == 1, f"the kernel source no longer has {pattern!r}: update this test"
    return source


@pytest.fixture(scope="module")
def attention():
    from torch.utils import cpp_extension

    kernels.load()  # the real library: its scalar path is the reference
    source = emulated_source()
    extras = (HERE / "simde_avx512_extras.h").read_text()
    key = hashlib.sha256((source + extras + torch.__version__).encode()).hexdigest()[:16]
    directory = kernels.kernel_cache() / f"emulated_{key}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "int8_attention_emulated.cpp").write_text(source)
    old_path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), old_path])
    try:
        cpp_extension.load(
            name=f"squant_emulated_{key}",
            sources=[str(directory / "int8_attention_emulated.cpp")],
            extra_cflags=[
                "-O1",
                "-std=c++17",
                "-mavx2",
                "-mfma",
                "-fno-math-errno",
                "-fopenmp",
                f"-I{HERE}",
                f"-I{SIMDE}",
            ],
            extra_ldflags=["-fopenmp"],
            build_directory=str(directory),
            is_python_module=False,
            verbose=False,
        )
    finally:
        os.environ["PATH"] = old_path
    assert tuple(torch.ops.squant_emulated.int8_attention_isas()) == EMULATED_ISAS
    return torch.ops.squant_emulated.int8_attention


@pytest.mark.parametrize("shape", [*SHAPES, (1, 64, 2, 48), (2, 33, 3, 80), (1, 200, 2, 100)])
def test_emulated_vnni_path_matches_float_and_the_scalar_path(attention, shape):
    # head sizes 48, 80, 100: the VNNI P·V tile's 3-, 4+1- and 4+3-block column splits
    scalar = check_matches_float(torch.ops.squant.int8_attention, "scalar", shape)
    check_matches_float(attention, "avx512_vnni", shape, scalar)


def test_emulated_vnni_path_flat_peaked_and_masked(attention):
    check_flat_and_peaked(attention, "avx512_vnni")
    check_masks(attention, "avx512_vnni")

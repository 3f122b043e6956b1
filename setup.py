"""Build of the compiled core: every csrc/*.pyx becomes a private module rune_fast.<name>.

RUNE_FAST_DEBUG=1 builds with -O0 -g and Cython bounds checks on.
"""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("RUNE_FAST_DEBUG") == "1"

if DEBUG:
    cflags = ["-O0", "-g", "-UNDEBUG"]
    directives = {"boundscheck": True, "wraparound": True, "initializedcheck": True}
else:
    cflags = ["-O3"]
    directives = {}

extensions = [
    Extension(
        "rune_fast." + os.path.splitext(os.path.basename(pyx))[0],
        [pyx],
        include_dirs=["csrc", "csrc/vendor/xxhash", numpy.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=cflags,
        # (_pages: zlib's crc32, dlopen for the system's libzstd: csrc/rf_zstd.h)
        libraries=["z"] if pyx.endswith("_pages.pyx") else [],
    )
    for pyx in sorted(glob.glob("csrc/*.pyx"))
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={
            "language_level": 3,
            "embedsignature": True,
            "binding": True,
            **directives,
        },
        include_path=["csrc"],
    ),
)

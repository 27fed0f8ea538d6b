"""cuda_library: compiles .cu files with the toolkit's nvcc and links them with cudart + cuBLAS.

nvcc needs the toolkit's real include tree, so its action runs outside the sandbox (`local`).
Code is built for sm_80 and sm_90, plus compute_90 PTX for newer devices. Without a toolkit the
macro produces a library with the headers only; code that calls into the CUDA objects must be
guarded with the PSCLUSTER_HAVE_CUDA define that `cuda_defines()` returns.
"""

load("@local_cuda//:defs.bzl", "CUDA_ENABLED", "NVCC")

NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-Wall",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_enabled():
    return CUDA_ENABLED

def if_cuda(if_true, if_false = []):
    return if_true if CUDA_ENABLED else if_false

def cuda_defines():
    return if_cuda(["PSCLUSTER_HAVE_CUDA=1"])

def cuda_library(name, srcs, hdrs = [], deps = [], nvcc_hdrs = [], visibility = None, **kwargs):
    """srcs: .cu files; hdrs: public headers (plain C++); nvcc_hdrs: extra headers the .cu include."""
    if not CUDA_ENABLED:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, visibility = visibility, **kwargs)
        return
    objs = []
    for src in srcs:
        base = src.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        obj = "_nvcc/%s/%s.pic.o" % (name, base)
        native.genrule(
            name = "%s_%s_nvcc" % (name, base),
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = "%s %s -I. -I$(GENDIR) -c $(location %s) -o $@" % (NVCC, " ".join(NVCC_FLAGS), src),
            local = True,
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_libs"],
        visibility = visibility,
        alwayslink = True,
        **kwargs
    )

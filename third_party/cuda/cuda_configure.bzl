"""Finds the CUDA toolkit and exposes it to the build as @local_cuda.

Search order: $PSCLUSTER_CUDA_PATH (the override: set it to a path without a toolkit, e.g.
`--repo_env=PSCLUSTER_CUDA_PATH=none`, to build the CPU backend only), then $CUDA_PATH, then
/usr/local/cuda. A toolkit counts as found when `bin/nvcc` exists under the path.

The generated repository holds:
  defs.bzl   CUDA_ENABLED, CUDA_PATH, NVCC (constants read by //third_party/cuda:cuda.bzl)
  BUILD      :cuda_libs, the link flags for cudart and cuBLAS (empty without a toolkit)
"""

def _find_toolkit(rctx):
    env = rctx.os.environ
    if "PSCLUSTER_CUDA_PATH" in env:
        candidates = [env["PSCLUSTER_CUDA_PATH"]]
    else:
        candidates = [env.get("CUDA_PATH", ""), "/usr/local/cuda"]
    for c in candidates:
        if c and rctx.path(c + "/bin/nvcc").exists:
            return c
    return None

def _impl(rctx):
    path = _find_toolkit(rctx)
    if path == None:
        rctx.file("defs.bzl", "CUDA_ENABLED = False\nCUDA_PATH = \"\"\nNVCC = \"\"\n")
        rctx.file("BUILD.bazel", """# No CUDA toolkit found: the CPU backend only.
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda_libs")
""")
        return
    libdir = path + "/lib64"
    if not rctx.path(libdir + "/libcublas.so").exists:
        libdir = path + "/targets/x86_64-linux/lib"
    if not rctx.path(libdir + "/libcublas.so").exists:
        fail("CUDA toolkit at %s has no libcublas.so (looked in lib64 and targets/x86_64-linux/lib)" % path)
    rctx.file("defs.bzl", "CUDA_ENABLED = True\nCUDA_PATH = %r\nNVCC = %r\n" % (path, path + "/bin/nvcc"))
    rctx.file("BUILD.bazel", """# CUDA toolkit found at {path}.
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_libs",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcublas", "-lcudart"],
)
""".format(path = path, lib = libdir))

cuda_configure = repository_rule(
    implementation = _impl,
    environ = ["PSCLUSTER_CUDA_PATH", "CUDA_PATH"],
    local = True,
)

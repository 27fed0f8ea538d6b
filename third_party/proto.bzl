"""ps_proto_library: .proto -> C++ (messages and gRPC stubs) with the system protoc and plugin.

    ps_proto_library(name = "ps_proto", srcs = ["ps.proto"], deps = [":common_proto"])

makes `:ps_proto`, a cc_library with ps.pb.{h,cc} and (grpc = True) ps.grpc.pb.{h,cc}. Imports
are written from the workspace root (`import "proto/common.proto";`).
"""

def ps_proto_library(name, srcs, deps = [], grpc = True, visibility = None, testonly = False):
    protos = name + "_protos"
    native.filegroup(
        name = protos,
        srcs = srcs + [d + "_protos" for d in deps],
        visibility = visibility,
        testonly = testonly,
    )
    pkg = native.package_name()
    outs = []
    for s in srcs:
        base = s[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    inputs = " ".join([(pkg + "/" + s) if pkg else s for s in srcs])
    cmd = "$(location @host_tools//:protoc) --proto_path=. --cpp_out=$(GENDIR)"
    tools = ["@host_tools//:protoc"]
    if grpc:
        cmd += (" --plugin=protoc-gen-grpc=$(location @host_tools//:grpc_cpp_plugin)" +
                " --grpc_out=$(GENDIR)")
        tools.append("@host_tools//:grpc_cpp_plugin")
    native.genrule(
        name = name + "_gen",
        srcs = [":" + protos],
        outs = outs,
        cmd = cmd + " " + inputs,
        tools = tools,
        message = "protoc " + inputs,
        testonly = testonly,
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        deps = deps + ["//third_party:protobuf"] + (["//third_party:grpc"] if grpc else []),
        visibility = visibility,
        testonly = testonly,
    )

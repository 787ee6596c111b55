"""cc_grpc_library: protoc + grpc_cpp_plugin from Debian, wrapped as a cc_library.

Bazel 4's native proto rules need a protobuf source tree; this macro runs the system
protoc instead. Imports resolve against the workspace root, /usr/include (well-known
types) and /usr/share/grpc-proto (grpc.health.v1).
"""

def cc_grpc_library(name, srcs, proto_root, deps = [], grpc = True, visibility = None, extra_inputs = []):
    """Generates C++ (and optionally gRPC) code for `srcs`.

    `proto_root` is the workspace folder that import paths are relative to (e.g. "proto"
    so that `import "handoff/v1/source.proto"` works); generated headers are included the
    same way (`#include "handoff/v1/source.pb.h"`).
    """
    pkg = native.package_name()
    if proto_root in ("", "."):
        proto_root = "."
        rel = pkg
    else:
        rel = pkg[len(proto_root):].strip("/")
    depth = len(rel.split("/")) if rel else 0
    outs = []
    for src in srcs:
        base = src[:-len(".proto")]
        outs += [base + ".pb.h", base + ".pb.cc"]
        if grpc:
            outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    grpc_flags = "--grpc_out=$(GENDIR)/" + proto_root + " --plugin=protoc-gen-grpc=/usr/bin/grpc_cpp_plugin" if grpc else ""
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + extra_inputs,
        outs = outs,
        cmd = " ".join([
            "/usr/bin/protoc",
            "-I" + proto_root,
            "-I/usr/include",
            "-I/usr/share/grpc-proto",
            "--cpp_out=$(GENDIR)/" + proto_root,
            grpc_flags,
        ] + ["%s/%s" % (pkg, s) if pkg else s for s in srcs]),
    )
    native.cc_library(
        name = name,
        srcs = [o for o in outs if o.endswith(".cc")],
        hdrs = [o for o in outs if o.endswith(".h")],
        strip_include_prefix = None if proto_root == "." else "/" + proto_root,
        deps = deps + ["@system//:grpc", "@system//:protobuf"],
        visibility = visibility,
    )

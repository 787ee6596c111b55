#!/usr/bin/env python3
"""Issue 8, hostile RPC input against the real handoffd (python3-grpcio, as tests/e2e).

Runs handoffd with --max_message_bytes=65536 --max_watchers=4 and sends: oversized
messages, invalid ids and specs, unknown enum values on the wire, huge page sizes, a
stale/unknown hold version, a WatchProgress flood beyond --max_watchers, tiny deadlines
and raw garbage on the gRPC port. Each must be refused with the right code, and after
each a health check and a GetSource still work (nothing else disturbed).
"""
import argparse
import os
import socket
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import handoffd_e2e as e2e  # noqa: E402

TRIED = []


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--handoffd", required=True)
    parser.add_argument("--proto_dir", required=True)
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="handoff-hostile-", dir=os.environ.get("TEST_TMPDIR"))
    e2e.generate_stubs(args.proto_dir, workdir)

    import grpc
    from handoff.v1 import consumer_admin_pb2 as admin
    from health_v1 import health_pb2

    server = e2e.Handoffd(os.path.abspath(args.handoffd), workdir, "hostile",
                          os.path.join(workdir, "data"),
                          ["--insecure_disable_auth", "--max_message_bytes=65536",
                           "--max_watchers=4"])
    channel = grpc.insecure_channel(server.target, options=[
        ("grpc.max_send_message_length", 64 << 20)])
    client = e2e.Client(channel)
    C = grpc.StatusCode

    def undisturbed(what):
        assert client.health_status("") == health_pb2.HealthCheckResponse.SERVING, what
        got = client.call("GetSource", admin.GetSourceRequest(source_id="base"))
        assert got.spec.id == "base", what
        assert server.proc.poll() is None, "handoffd died after " + what

    def refused(what, code, method, request, contains=None):
        e2e.expect_code(code, client.call, method, request, contains=contains)
        TRIED.append(what)
        undisturbed(what)

    try:
        client.call("CreateSource", admin.CreateSourceRequest(spec=e2e.local_spec("base")))
        undisturbed("setup")

        # Oversized messages (the server's limit is 64 KiB).
        big = e2e.local_spec("big")
        big.filter = "x" * (200 << 10)
        refused("200 KiB CreateSource", C.RESOURCE_EXHAUSTED, "CreateSource",
                admin.CreateSourceRequest(spec=big))
        refused("4 MiB GetSource id", C.RESOURCE_EXHAUSTED, "GetSource",
                admin.GetSourceRequest(source_id="a" * (4 << 20)))

        # Invalid ids and specs: INVALID_ARGUMENT naming the field.
        for bad_id in ("", "Bad_Id!", "a" * 1000, "../../etc", "x\x00y", "\u00e9t\u00e9"):
            refused("id %r" % bad_id[:12], C.INVALID_ARGUMENT, "CreateSource",
                    admin.CreateSourceRequest(spec=e2e.local_spec(bad_id)), contains="id")
        for field, value in (("provider_url", "ftp://x"), ("provider_url", ""),
                             ("chain", ""), ("page_limit", 5000)):
            spec = e2e.local_spec("spec-" + field.replace("_", "-"))
            setattr(spec, field, value)
            refused("%s=%r" % (field, value), C.INVALID_ARGUMENT, "CreateSource",
                    admin.CreateSourceRequest(spec=spec), contains=field)
        no_target = e2e.local_spec("no-target")
        no_target.sink.downstream.target = ""
        refused("downstream without target", C.INVALID_ARGUMENT, "CreateSource",
                admin.CreateSourceRequest(spec=no_target), contains="sink.downstream.target")

        # Unknown enum values sent on the wire (proto3 enums are open).
        spec = e2e.local_spec("enum-99")
        spec.transport = 99
        refused("transport=99", C.INVALID_ARGUMENT, "CreateSource",
                admin.CreateSourceRequest(spec=spec), contains="transport")
        spec = e2e.local_spec("gate-99")
        spec.sink.gate = 99
        refused("gate=99", C.INVALID_ARGUMENT, "CreateSource",
                admin.CreateSourceRequest(spec=spec), contains="spec.sink.gate")
        refused("hold decision=99", C.INVALID_ARGUMENT, "ResolveHold",
                admin.ResolveHoldRequest(source_id="base", stage=1, block_number=1,
                                         log_index=0, decision=99, hold_version=1))

        # Huge and negative page sizes, garbage tokens.
        for size in (2**31 - 1, -1, 1001):
            refused("ListSources page_size=%d" % size, C.INVALID_ARGUMENT, "ListSources",
                    admin.ListSourcesRequest(page_size=size), contains="page_size")
        for size in (2**31 - 1, -2**31, 10001):  # QueryEvents allows 1..10000
            refused("QueryEvents page_size=%d" % size, C.INVALID_ARGUMENT, "QueryEvents",
                    admin.QueryEventsRequest(source_id="base", page_size=size),
                    contains="page_size")
        refused("QueryEvents page_token", C.INVALID_ARGUMENT, "QueryEvents",
                admin.QueryEventsRequest(source_id="base", page_token="\xff" * 16),
                contains="page_token")

        # A hold that does not exist / a stale version: never applied.
        try:
            client.call("ResolveHold", admin.ResolveHoldRequest(
                source_id="base", stage=1, block_number=7, log_index=0, decision=1,
                hold_version=12345))
            raise AssertionError("ResolveHold of a missing hold succeeded")
        except grpc.RpcError as err:
            assert err.code() in (C.NOT_FOUND, C.ABORTED, C.FAILED_PRECONDITION,
                                  C.INVALID_ARGUMENT), err
        TRIED.append("stale hold version")
        undisturbed("stale hold")

        # WatchProgress flood: 4 allowed, the 5th and later RESOURCE_EXHAUSTED while the
        # four keep delivering; after they end, a new watcher is admitted.
        streams = []
        for _ in range(4):
            s = client.admin.WatchProgress(admin.WatchProgressRequest(
                source_id="base", heartbeat_ms=100), timeout=e2e.RPC_TIMEOUT_S)
            next(s)
            streams.append(s)
        for _ in range(20):
            extra = client.admin.WatchProgress(admin.WatchProgressRequest(
                source_id="base", heartbeat_ms=100), timeout=e2e.RPC_TIMEOUT_S)
            e2e.expect_code(C.RESOURCE_EXHAUSTED, next, extra)
        TRIED.append("20 watchers beyond --max_watchers")
        undisturbed("watcher flood")
        for s in streams:
            assert next(s).source_id == "base", "existing watchers keep working"
            s.cancel()

        def admitted():
            s = client.admin.WatchProgress(admin.WatchProgressRequest(
                source_id="base", heartbeat_ms=100), timeout=e2e.RPC_TIMEOUT_S)
            try:
                next(s)
                s.cancel()
                return True
            except grpc.RpcError as err:
                if err.code() != C.RESOURCE_EXHAUSTED:
                    raise
                return False
        e2e.wait_until("a watcher slot to free up", admitted)

        # Deadlines: a stream that outlives its deadline ends DEADLINE_EXCEEDED.
        # (The slot of the stream admitted above is released asynchronously after its
        # cancel: open until admitted.)
        def deadline_stream():
            s = client.admin.WatchProgress(admin.WatchProgressRequest(
                source_id="base", heartbeat_ms=60000), timeout=3)  # room for a loaded machine
            try:
                next(s)
                return s
            except grpc.RpcError as err:
                if err.code() != C.RESOURCE_EXHAUSTED:
                    raise
                return None
        s = e2e.wait_until("a watcher slot for the deadline stream", deadline_stream)
        e2e.expect_code(C.DEADLINE_EXCEEDED, next, s)
        TRIED.append("deadlines")
        undisturbed("deadlines")

        # Raw garbage on the gRPC port (not HTTP/2), and a half-open preface.
        for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", os.urandom(65536),
                     b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 4096):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
                try:
                    sock.sendall(junk)
                    sock.recv(1024)
                except OSError:
                    pass
        TRIED.append("raw garbage on the gRPC port")
        undisturbed("garbage bytes")
    except BaseException:
        server.kill()
        e2e.log(server.log_text())
        raise
    server.stop()
    e2e.log("ok - %d hostile RPC inputs refused with the right code, nothing disturbed" %
            len(TRIED))
    e2e.log("PASS")


if __name__ == "__main__":
    main()

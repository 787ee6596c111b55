#!/usr/bin/python3
"""End-to-end test of the real handoffd binary with a client Handoff did not write.

The client is Debian's python3-grpcio; stubs are generated at test time with
python3-grpc-tools from the project's protos and Debian's grpc-proto (health,
reflection). Run with /usr/bin/python3 (the `python3` on PATH may be another
interpreter without these packages).

  handoffd_e2e.py --handoffd=PATH --proto_dir=DIR

Covers: health (overall and per source), reflection (list and describe, including
grpc.health.v1.Health), the admin API round trip (create, list, get, start, watch,
stop, delete), INVALID_ARGUMENT naming the field, persistence across a SIGTERM
restart, Prometheus metrics, JSON logs, bearer-token roles (each denial), TLS with a
self-signed certificate, mTLS, and that no token ever appears in logs or replies.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import procs  # noqa: E402  (tests/testing/procs.py)
from procs import generate_stubs, log, wait_until  # noqa: E402, F401

OPERATOR_TOKEN = "e2e-operator-token-7d1f0c2a9b"
READER_TOKEN = "e2e-reader-token-3c5e8a1f4d"
RPC_TIMEOUT_S = 20


def run(cmd, **kw):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def make_certs(d):
    """A self-signed server certificate (its own root) and a client CA with one client
    certificate, all with openssl."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509"] + ec + [
        "-keyout", f"{d}/server.key", "-out", f"{d}/server.pem", "-days", "2",
        "-subj", "/CN=localhost",
        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"])
    run(["openssl", "req", "-x509"] + ec + [
        "-keyout", f"{d}/client-ca.key", "-out", f"{d}/client-ca.pem", "-days", "2",
        "-subj", "/CN=handoff-e2e-client-ca"])
    run(["openssl", "req"] + ec + [
        "-keyout", f"{d}/client.key", "-out", f"{d}/client.csr", "-subj", "/CN=e2e-client"])
    with open(f"{d}/client.ext", "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    run(["openssl", "x509", "-req", "-in", f"{d}/client.csr", "-CA", f"{d}/client-ca.pem",
         "-CAkey", f"{d}/client-ca.key", "-CAcreateserial", "-out", f"{d}/client.pem",
         "-days", "2", "-extfile", f"{d}/client.ext"])


def read(path):
    with open(path, "rb") as f:
        return f.read()


class Handoffd(procs.Handoffd):
    """The real binary with metrics and debug logs, auth as each phase's flags say:
    started on a free port, stopped with SIGTERM."""

    BASE_FLAGS = ("--metrics_listen=127.0.0.1:0", "--health_listen=127.0.0.1:0",
                  "--log_level=debug", "--shutdown_grace=10s")
    PORTS = ("grpc", "health", "metrics")

    def __init__(self, binary, workdir, name, data_dir, flags):
        super().__init__(binary, workdir, name, data_dir, flags)
        self.metrics_port = self.ports["metrics"]

    def thread_names(self):
        """The names of the process's threads (/proc/<pid>/task/*/comm)."""
        names = []
        task_dir = "/proc/%d/task" % self.proc.pid
        for tid in os.listdir(task_dir):
            try:
                names.append(read(os.path.join(task_dir, tid, "comm")).decode().strip())
            except OSError:
                pass  # the thread ended meanwhile
        return names

    def thread_policies(self):
        """(name, scheduling policy) of each thread: 0 SCHED_OTHER, 2 SCHED_RR, ..."""
        threads = []
        task_dir = "/proc/%d/task" % self.proc.pid
        for tid in os.listdir(task_dir):
            try:
                stat = read(os.path.join(task_dir, tid, "stat")).decode()
            except OSError:
                continue  # the thread ended meanwhile
            # "pid (comm) state ...": the policy is field 41, the 39th after the name.
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            threads.append((name, int(stat[stat.rindex(")") + 2:].split()[38])))
        return threads

    def log_entries(self, msg):
        return [json.loads(line) for line in self.log_text().splitlines()
                if '"%s"' % msg in line]

    def serving_entry(self):
        """The "serving" log line. The port file the start waited for is written just
        before it, so the line may come a moment after."""
        return wait_until(self.name + " serving log line",
                          lambda: self.log_entries("serving"))[0]


class Client:
    def __init__(self, channel, token=None):
        import grpc  # noqa: F401
        from handoff.v1 import consumer_admin_pb2_grpc
        from health_v1 import health_pb2_grpc
        from reflection_v1alpha import reflection_pb2_grpc
        self.channel = channel
        self.metadata = (("authorization", "Bearer " + token),) if token else ()
        self.admin = consumer_admin_pb2_grpc.ConsumerAdminStub(channel)
        self.health = health_pb2_grpc.HealthStub(channel)
        self.reflection = reflection_pb2_grpc.ServerReflectionStub(channel)

    def call(self, method, request):
        return getattr(self.admin, method)(request, metadata=self.metadata,
                                           timeout=RPC_TIMEOUT_S)

    def health_status(self, service=""):
        from health_v1 import health_pb2
        return self.health.Check(health_pb2.HealthCheckRequest(service=service),
                                 timeout=RPC_TIMEOUT_S).status

    def reflect(self, **request):
        from reflection_v1alpha import reflection_pb2
        responses = self.reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(**request)]), timeout=RPC_TIMEOUT_S)
        return next(iter(responses))


def expect_code(code, fn, *args, contains=None):
    import grpc
    try:
        fn(*args)
    except grpc.RpcError as e:
        assert e.code() == code, "expected %s, got %s: %s" % (code, e.code(), e.details())
        if contains is not None:
            assert contains in (e.details() or ""), \
                "%s: %r does not mention %r" % (code, e.details(), contains)
        return e
    raise AssertionError("expected %s, call succeeded" % code)


def local_spec(source_id):
    from handoff.v1 import source_pb2
    spec = source_pb2.SourceSpec(
        id=source_id, provider_url="http://127.0.0.1:9", chain="testnet", source="e2e",
        filter="all", transport=source_pb2.TRANSPORT_POLL, page_limit=100)
    spec.start.block = 1
    spec.sink.local_rows.SetInParent()
    return spec


def check_reflection(client):
    from google.protobuf import descriptor_pb2
    services = {s.name for s in
                client.reflect(list_services="").list_services_response.service}
    for expected in ("handoff.v1.ConsumerAdmin", "grpc.health.v1.Health"):
        assert expected in services, "reflection lists %s" % sorted(services)
    assert "handoff.v1.EventSink" not in services, "EventSink is not served by handoffd"

    def describe(symbol):
        response = client.reflect(file_containing_symbol=symbol)
        assert response.HasField("file_descriptor_response"), \
            "%s not described: %s" % (symbol, response)
        files = []
        for raw in response.file_descriptor_response.file_descriptor_proto:
            fd = descriptor_pb2.FileDescriptorProto()
            fd.ParseFromString(raw)
            files.append(fd)
        return files

    health_files = describe("grpc.health.v1.Health")
    methods = {m.name for f in health_files for s in f.service if s.name == "Health"
               for m in s.method}
    assert {"Check", "Watch"} <= methods, methods
    admin_files = describe("handoff.v1.ConsumerAdmin")
    methods = {m.name for f in admin_files for s in f.service if s.name == "ConsumerAdmin"
               for m in s.method}
    for rpc in ("CreateSource", "ListSources", "GetSource", "WatchProgress", "ResolveHold",
                "QueryEvents", "RebuildSource"):
        assert rpc in methods, methods
    log("ok - reflection lists and describes ConsumerAdmin and grpc.health.v1.Health")


def check_metrics(server, source_id):
    text = urllib.request.urlopen(
        "http://127.0.0.1:%d/metrics" % server.metrics_port, timeout=RPC_TIMEOUT_S).read().decode()
    for expected in (
            "handoff_store_healthy 1",
            "handoff_store_memtable_bytes ",
            "handoff_store_block_cache_bytes ",
            "handoff_page_slots 5",  # --max_pages_in_flight of the "plain" server
            "handoff_page_slots_held 0",  # the source is stopped: its pages are released
            "handoff_page_slot_waiters 0",
            'handoff_source_state{source="%s",state="SOURCE_STATE_STOPPED"} 1' % source_id,
            'handoff_events_applied_total{source="%s"} 0' % source_id,
            'handoff_lag_blocks{source="%s"}' % source_id,
            'handoff_open_holds{source="%s"} 0' % source_id):
        assert expected in text, "metrics lack %r:\n%s" % (expected, text)
    log("ok - metrics scraped")


def check_storage_flags(binary, workdir, data_dir):
    for flag, message in (("--write_buffer_mb=2", "--write_buffer_mb=2 is outside 4..1024"),
                          ("--block_cache_mb=0", "--block_cache_mb=0 is outside 8..65536"),
                          ("--wal_sync_interval=1s", "--wal_sync_interval=1s is outside 0..100ms"),
                          ("--max_pages_in_flight=0",
                           "--max_pages_in_flight=0 is outside 1..4096"),
                          ("--admin_realtime_priority=100",
                           "--admin_realtime_priority=100 is outside 0..99")):
        out = subprocess.run([binary, "--data_dir=" + data_dir, "--insecure_disable_auth", flag],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
        assert out.returncode != 0 and message in out.stdout.decode(), out.stdout.decode()
    log("ok - storage, page-budget and scheduling flags out of range refused at start")


SCHED_OTHER, SCHED_RR = 0, 2


def check_admin_threads_realtime(server):
    """The default --admin_realtime_priority=1: after a point read, the gRPC thread that
    answered waits for the next call under SCHED_RR, and every gRPC thread that waits for
    network events (its callback threads read admin requests too) waits under it from
    the start; without CAP_SYS_NICE, a warning saying why and normal threads."""
    serving = [server.serving_entry()]
    policies = server.thread_policies()
    grpc_policies = [p for name, p in policies if name.startswith("grpcpp")]
    callback_policies = [p for name, p in policies if name == "nexting_thread"]
    if serving[0].get("admin_threads") == "SCHED_RR 1":
        # A sync-server thread gRPC started after the calls so far may still be normal: it
        # waits real-time once it has answered a point read.
        assert SCHED_RR in grpc_policies, policies
        assert callback_policies and set(callback_policies) == {SCHED_RR}, policies
        assert int(serving[0].get("grpc_pollers_realtime")) >= len(callback_policies) + 1, serving
        # Only gRPC's: the workers, RocksDB's and the provider's threads stay normal.
        others = [(n, p) for n, p in policies
                  if not (n.startswith("grpcpp") or n == "nexting_thread") and p == SCHED_RR]
        assert not others, others
        log("ok - admin and gRPC callback threads wait under SCHED_RR, no other thread does")
    else:
        assert serving[0].get("admin_threads") == "normal", serving
        warned = server.log_entries("admin calls run at normal priority")
        assert warned and "CAP_SYS_NICE" in warned[0].get("reason", ""), server.log_text()
        assert SCHED_RR not in grpc_policies + callback_policies, policies
        assert serving[0].get("grpc_pollers_realtime") == "0", serving
        log("ok - no CAP_SYS_NICE: admin threads at normal priority, with a warning")


def check_json_logs(server):
    for line in server.log_text().splitlines():
        entry = json.loads(line)  # every line is one JSON object
        assert {"ts", "level", "msg"} <= set(entry), line


def phase_plain(binary, workdir, data_dir):
    """No TLS, authentication disabled (development mode)."""
    import grpc
    from handoff.v1 import consumer_admin_pb2 as admin
    from health_v1 import health_pb2

    check_storage_flags(binary, workdir, data_dir)
    server = Handoffd(binary, workdir, "plain", data_dir,
                      ["--insecure_disable_auth", "--write_buffer_mb=16", "--block_cache_mb=32",
                       "--max_pages_in_flight=5"])
    try:
        # The storage flags reach the database: its memory ceiling (store.h) is
        # 3 x 2 x (16 + 2 + 1) MiB of per-event memtables, 7 x 2 x (4 + 0.5 + 1) MiB of
        # small ones and the 32 MiB cache.
        opened = [json.loads(line) for line in server.log_text().splitlines()
                  if '"database open"' in line]
        assert opened and opened[0].get("memory_ceiling_mib") == "223", server.log_text()
        assert opened[0].get("page_slots") == "5", server.log_text()  # --max_pages_in_flight
        client = Client(grpc.insecure_channel(server.target))
        assert client.health_status("") == health_pb2.HealthCheckResponse.SERVING
        assert client.health_status("handoff.v1.ConsumerAdmin") == \
            health_pb2.HealthCheckResponse.SERVING
        log("ok - health SERVING")
        check_reflection(client)

        spec = local_spec("e2e-local")
        created = client.call("CreateSource", admin.CreateSourceRequest(spec=spec))
        assert created.spec.id == "e2e-local" and created.spec.chain == "testnet"
        again = client.call("CreateSource", admin.CreateSourceRequest(spec=spec))
        assert again.spec.id == "e2e-local", "identical CreateSource is idempotent"
        changed = local_spec("e2e-local")
        changed.chain = "othernet"
        expect_code(grpc.StatusCode.ALREADY_EXISTS, client.call, "CreateSource",
                    admin.CreateSourceRequest(spec=changed))
        listed = client.call("ListSources", admin.ListSourcesRequest())
        assert [s.spec.id for s in listed.sources] == ["e2e-local"], listed
        got = client.call("GetSource", admin.GetSourceRequest(source_id="e2e-local"))
        assert got.spec.provider_url == spec.provider_url
        assert got.spec.sink.HasField("local_rows")
        log("ok - CreateSource / ListSources / GetSource round trip")
        check_admin_threads_realtime(server)

        bad = local_spec("Bad_Id!")
        expect_code(grpc.StatusCode.INVALID_ARGUMENT, client.call, "CreateSource",
                    admin.CreateSourceRequest(spec=bad), contains="id")
        expect_code(grpc.StatusCode.INVALID_ARGUMENT, client.call, "ListSources",
                    admin.ListSourcesRequest(page_size=5000), contains="page_size")
        expect_code(grpc.StatusCode.INVALID_ARGUMENT, client.call, "ListSources",
                    admin.ListSourcesRequest(page_token="not a token!"), contains="page_token")
        expect_code(grpc.StatusCode.NOT_FOUND, client.call, "GetSource",
                    admin.GetSourceRequest(source_id="no-such-source"))
        log("ok - bad arguments are INVALID_ARGUMENT naming the field")

        # Life cycle of a second source: start, watch, stop, delete.
        client.call("CreateSource", admin.CreateSourceRequest(spec=local_spec("e2e-cycle")))
        client.call("StartSource", admin.StartSourceRequest(source_id="e2e-cycle"))
        # Its ingest thread carries its name (base/thread_name.h), not the name of
        # the gRPC handler that started it.
        wait_until("a thread named in:e2e-cycle",
                   lambda: "in:e2e-cycle" in server.thread_names())
        # StartSource ran on an admin thread; what it started never runs real-time.
        started = [p for name, p in server.thread_policies() if name.endswith(":e2e-cycle")]
        assert started and set(started) == {SCHED_OTHER}, server.thread_policies()
        stream = client.admin.WatchProgress(
            admin.WatchProgressRequest(source_id="e2e-cycle", heartbeat_ms=200),
            metadata=client.metadata, timeout=RPC_TIMEOUT_S)
        first = next(stream)
        assert first.source_id == "e2e-cycle", first
        next(stream)  # a change or a heartbeat
        stream.cancel()
        stopped = client.call("StopSource", admin.StopSourceRequest(source_id="e2e-cycle"))
        assert stopped.progress.state == 1, stopped.progress  # SOURCE_STATE_STOPPED
        wait_until("the threads of e2e-cycle to end",
                   lambda: "in:e2e-cycle" not in server.thread_names())
        client.call("DeleteSource", admin.DeleteSourceRequest(source_id="e2e-cycle"))
        expect_code(grpc.StatusCode.NOT_FOUND, client.call, "GetSource",
                    admin.GetSourceRequest(source_id="e2e-cycle"))
        log("ok - start, watch, stop, delete")

        # Per-source health: a stopped source is NOT_SERVING; an unknown name NOT_FOUND.
        def source_health(name):
            try:
                return client.health_status(name)
            except grpc.RpcError as e:  # NOT_FOUND until the next health tick
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                return None

        wait_until("health of e2e-local", lambda: source_health("e2e-local") ==
                   health_pb2.HealthCheckResponse.NOT_SERVING)
        expect_code(grpc.StatusCode.NOT_FOUND, client.health_status, "never-created")
        log("ok - per-source health")

        check_metrics(server, "e2e-local")
    except BaseException:
        server.kill()
        log(server.log_text())
        raise
    server.stop()
    check_json_logs(server)
    assert "authentication DISABLED" in server.log_text()
    log("ok - SIGTERM exits 0 after an ordered shutdown; logs are JSON lines")


def check_handoffctl(handoffctl, server, workdir, certs):
    """scripts/handoffctl over mTLS, its token from the environment."""
    env = dict(os.environ, HANDOFF_TOKEN=READER_TOKEN,
               HANDOFFCTL_CACHE=os.path.join(workdir, "handoffctl-cache"))
    base = ["/usr/bin/python3", handoffctl, "--target", server.target,
            "--tls-ca", certs + "/server.pem"]
    mtls = base + ["--tls-cert", certs + "/client.pem", "--tls-key", certs + "/client.key"]
    got = subprocess.run(mtls + ["get", "e2e-local"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert got.returncode == 0, got.stderr
    assert 'id: "e2e-local"' in got.stdout, got.stdout
    # Without the client certificate the mTLS port refuses it, with a clear error.
    refused = subprocess.run(base + ["get", "e2e-local"], env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode != 0 and "UNAVAILABLE" in refused.stderr, refused.stderr
    assert READER_TOKEN not in got.stdout + got.stderr + refused.stderr
    log("ok - handoffctl over mTLS (and refused without a client certificate)")


def phase_secure(binary, workdir, data_dir, certs, handoffctl=None):
    """TLS with a self-signed certificate and bearer tokens; then mTLS."""
    import grpc
    from handoff.v1 import consumer_admin_pb2 as admin
    from health_v1 import health_pb2

    tokens = os.path.join(workdir, "tokens")
    with open(tokens, "w") as f:
        f.write("# name role token\n")
        f.write("e2e-ops operator %s\n" % OPERATOR_TOKEN)
        f.write("e2e-dash reader %s\n" % READER_TOKEN)
    tls = ["--tls_cert=%s/server.pem" % certs, "--tls_key=%s/server.key" % certs]
    server = Handoffd(binary, workdir, "secure", data_dir,
                      tls + ["--auth_tokens_file=" + tokens, "--admin_realtime_priority=0"])
    try:
        serving = server.serving_entry()
        assert serving.get("admin_threads") == "normal", server.log_text()
        assert serving.get("grpc_pollers_realtime") == "0", server.log_text()
        creds = grpc.ssl_channel_credentials(root_certificates=read(certs + "/server.pem"))
        channel = grpc.secure_channel(server.target, creds)
        anonymous, reader = Client(channel), Client(channel, READER_TOKEN)
        operator = Client(channel, OPERATOR_TOKEN)
        wrong = Client(channel, "e2e-wrong-token-0000000000")

        assert anonymous.health_status("") == health_pb2.HealthCheckResponse.SERVING
        probe = Client(grpc.insecure_channel("127.0.0.1:%d" % server.health_port))
        assert probe.health_status("") == health_pb2.HealthCheckResponse.SERVING
        check_reflection(anonymous)
        log("ok - health and reflection stay open without a token (TLS)")

        # The source created in the plain phase survived the restart.
        got = reader.call("GetSource", admin.GetSourceRequest(source_id="e2e-local"))
        assert got.spec.id == "e2e-local"
        log("ok - sources persist across a restart")
        # --admin_realtime_priority=0: the point read left every thread normal.
        assert SCHED_RR not in [p for _, p in server.thread_policies()], \
            server.thread_policies()

        get = admin.GetSourceRequest(source_id="e2e-local")
        create = admin.CreateSourceRequest(spec=local_spec("e2e-secure"))
        denials = [
            expect_code(grpc.StatusCode.UNAUTHENTICATED, anonymous.call, "GetSource", get),
            expect_code(grpc.StatusCode.UNAUTHENTICATED, wrong.call, "GetSource", get),
            expect_code(grpc.StatusCode.UNAUTHENTICATED, anonymous.call, "CreateSource", create),
            expect_code(grpc.StatusCode.PERMISSION_DENIED, reader.call, "CreateSource", create),
            expect_code(grpc.StatusCode.PERMISSION_DENIED, reader.call, "StartSource",
                        admin.StartSourceRequest(source_id="e2e-local")),
            expect_code(grpc.StatusCode.PERMISSION_DENIED, reader.call, "StopSource",
                        admin.StopSourceRequest(source_id="e2e-local")),
            expect_code(grpc.StatusCode.PERMISSION_DENIED, reader.call, "DeleteSource",
                        admin.DeleteSourceRequest(source_id="e2e-local")),
            expect_code(grpc.StatusCode.PERMISSION_DENIED, reader.call, "RebuildSource",
                        admin.RebuildSourceRequest(source_id="e2e-local", from_block=1)),
            expect_code(grpc.StatusCode.PERMISSION_DENIED, reader.call, "ResolveHold",
                        admin.ResolveHoldRequest(source_id="e2e-local", reason="x")),
        ]
        reader.call("ListSources", admin.ListSourcesRequest())
        reader.call("GetProgress", admin.GetProgressRequest(source_id="e2e-local"))
        reader.call("ListHolds", admin.ListHoldsRequest())
        reader.call("ListQuarantine", admin.ListQuarantineRequest(source_id="e2e-local"))
        operator.call("CreateSource", create)
        log("ok - token roles: UNAUTHENTICATED, PERMISSION_DENIED, reader reads, operator creates")

        insecure = Client(grpc.insecure_channel(server.target))
        expect_code(grpc.StatusCode.UNAVAILABLE, insecure.health_status, "")
        log("ok - plaintext refused on the TLS port")
    except BaseException:
        server.kill()
        log(server.log_text())
        raise
    server.stop()
    check_json_logs(server)
    for secret in (OPERATOR_TOKEN, READER_TOKEN):
        assert secret not in server.log_text(), "a token leaked into the log"
        for denial in denials:
            assert secret not in (denial.details() or ""), "a token leaked into an error"
    log("ok - no token in logs or errors")

    # mTLS: the client CA is required and verified.
    server = Handoffd(binary, workdir, "mtls", data_dir,
                      tls + ["--tls_client_ca=%s/client-ca.pem" % certs,
                             "--auth_tokens_file=" + tokens])
    try:
        no_cert = grpc.ssl_channel_credentials(root_certificates=read(certs + "/server.pem"))
        expect_code(grpc.StatusCode.UNAVAILABLE,
                    Client(grpc.secure_channel(server.target, no_cert)).health_status, "")
        with_cert = grpc.ssl_channel_credentials(
            root_certificates=read(certs + "/server.pem"),
            private_key=read(certs + "/client.key"),
            certificate_chain=read(certs + "/client.pem"))
        client = Client(grpc.secure_channel(server.target, with_cert), READER_TOKEN)
        assert client.health_status("") == health_pb2.HealthCheckResponse.SERVING
        client.call("GetSource", admin.GetSourceRequest(source_id="e2e-local"))
        log("ok - mTLS: no client certificate refused, a CA-signed one accepted")
        if handoffctl:
            check_handoffctl(handoffctl, server, workdir, certs)
    except BaseException:
        server.kill()
        log(server.log_text())
        raise
    server.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--handoffd", required=True)
    parser.add_argument("--proto_dir", required=True)
    parser.add_argument("--handoffctl", help="scripts/handoffctl, driven over mTLS")
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="handoff-e2e-", dir=os.environ.get("TEST_TMPDIR"))
    generate_stubs(args.proto_dir, workdir)
    certs = os.path.join(workdir, "certs")
    os.makedirs(certs)
    make_certs(certs)
    binary = os.path.abspath(args.handoffd)
    data_dir = os.path.join(workdir, "data")
    phase_plain(binary, workdir, data_dir)
    phase_secure(binary, workdir, data_dir, certs,
                 os.path.abspath(args.handoffctl) if args.handoffctl else None)
    log("PASS")


if __name__ == "__main__":
    main()

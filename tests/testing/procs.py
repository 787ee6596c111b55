"""Process helpers shared by the Python tests that run the real binaries: the end-to-end
tests (tests/e2e, tests/hostile), the torture driver and the process-level storage tests.

Runs the real binaries (handoffd, provider_sim, sample_sink) as child processes on
port 0 and talks to them with Debian's python3-grpcio (stubs generated at run time by
python3-grpc-tools: generate_stubs). Run with /usr/bin/python3.

Nothing here sleeps to synchronise: every wait polls an observable condition (a port
file, an RPC answer, a process exit) against a deadline.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

GRPC_PROTO_DIR = "/usr/share/grpc-proto"
START_TIMEOUT_S = 60
RPC_TIMEOUT_S = 20
POLL_S = 0.02


def log(msg):
    print(msg, flush=True)


class Timeout(AssertionError):
    pass


def wait_until(what, predicate, timeout_s=RPC_TIMEOUT_S, poll_s=POLL_S):
    """Polls `predicate` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Timeout("timed out after %.0fs waiting for %s" % (timeout_s, what))
        time.sleep(poll_s)


def setup_sink_test():
    """The common start of a test that runs handoffd, the provider simulator and the
    sample sink: parses --handoffd, --provider_sim, --sample_sink and --proto_dir, makes a
    work directory under TEST_TMPDIR and generates the stubs there (the sample sink's
    admin service's too). Returns (args, work)."""
    p = argparse.ArgumentParser()
    for flag in ("handoffd", "provider_sim", "sample_sink", "proto_dir"):
        p.add_argument("--" + flag, required=True)
    a = p.parse_args()
    work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
    generate_stubs(a.proto_dir, work, sink_proto_dir=os.path.join(
        os.path.dirname(os.path.abspath(a.proto_dir)), "sim", "sample_sink"))
    return a, work


def generate_stubs(proto_dir, out_dir, sink_proto_dir=None):
    """Generates Python stubs of handoff.v1, grpc.health.v1 and grpc.reflection.v1alpha
    (under the package names health_v1 and reflection_v1alpha, so that they do not
    shadow the real `grpc` package) and, given `sink_proto_dir`, of the sample sink's
    admin service (module sample_sink_admin_pb2). Adds them to sys.path and returns
    their directory. The one stub generator of the Python tests."""
    from grpc_tools import protoc  # python3-grpc-tools

    proto_dir = os.path.abspath(proto_dir)
    src = os.path.join(out_dir, "protos")
    inputs = []
    for package, rel in (("health_v1", "grpc/health/v1/health.proto"),
                         ("reflection_v1alpha", "grpc/reflection/v1alpha/reflection.proto")):
        os.makedirs(os.path.join(src, package), exist_ok=True)
        copy = os.path.join(src, package, os.path.basename(rel))
        shutil.copy(os.path.join(GRPC_PROTO_DIR, rel), copy)
        inputs.append(copy)
    if sink_proto_dir is not None:
        copy = os.path.join(src, "sample_sink_admin.proto")
        shutil.copy(os.path.join(sink_proto_dir, "sample_sink_admin.proto"), copy)
        inputs.append(copy)
    inputs += sorted(
        os.path.join(proto_dir, "handoff/v1", f)
        for f in os.listdir(os.path.join(proto_dir, "handoff/v1")) if f.endswith(".proto"))
    gen = os.path.join(out_dir, "gen")
    os.makedirs(gen, exist_ok=True)
    rc = protoc.main(["protoc", "-I" + proto_dir, "-I" + src, "-I/usr/include",
                      "--python_out=" + gen, "--grpc_python_out=" + gen] + inputs)
    if rc != 0:
        raise RuntimeError("grpc_tools.protoc failed: %d" % rc)
    sys.path.insert(0, gen)
    return gen


def read_text(path):
    with open(path, "rb") as f:
        return f.read().decode(errors="replace")


def tail(path, lines=40):
    try:
        return "\n".join(read_text(path).splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Handoffd:
    """One incarnation of the real handoffd: started on port 0, then killed (SIGKILL)
    or stopped (SIGTERM). Subclasses change BASE_FLAGS and the ports they wait for."""

    # Besides --listen, --port_file and --data_dir, which every incarnation gets.
    BASE_FLAGS = ("--health_listen=127.0.0.1:0", "--insecure_disable_auth",
                  "--shutdown_grace=20s")
    PORTS = ("grpc", "health")

    def __init__(self, binary, workdir, name, data_dir, flags=(), wait_ready=True):
        self.name = name
        self.port_file = os.path.join(workdir, name + ".port")
        self.log_path = os.path.join(workdir, name + ".log")
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.log_file = open(self.log_path, "wb")
        self.argv = ([binary, "--listen=127.0.0.1:0", "--port_file=" + self.port_file,
                      "--data_dir=" + data_dir] + list(self.BASE_FLAGS) + list(flags))
        self.proc = subprocess.Popen(self.argv, stdout=self.log_file, stderr=subprocess.STDOUT)
        self.channel = None
        if wait_ready:
            self.wait_ready()

    def wait_ready(self):
        def ready():
            if self.proc.poll() is not None:
                raise AssertionError("%s exited with %d before serving:\n%s" %
                                     (self.name, self.proc.returncode, tail(self.log_path)))
            if not os.path.exists(self.port_file):
                return False
            ports = dict(line.split() for line in read_text(self.port_file).splitlines()
                         if len(line.split()) == 2)
            return ports if all(p in ports for p in self.PORTS) else False

        self.ports = {k: int(v) for k, v in
                      wait_until(self.name + " port file", ready, START_TIMEOUT_S).items()}
        self.port, self.health_port = self.ports["grpc"], self.ports["health"]
        self.target = "127.0.0.1:%d" % self.port
        import grpc
        from handoff.v1 import consumer_admin_pb2_grpc
        from health_v1 import health_pb2_grpc
        self.channel = grpc.insecure_channel(self.target)
        self.admin = consumer_admin_pb2_grpc.ConsumerAdminStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    def call(self, method, request, timeout=RPC_TIMEOUT_S):
        return getattr(self.admin, method)(request, timeout=timeout)

    def health(self, service=""):
        from health_v1 import health_pb2
        return self.health_stub.Check(health_pb2.HealthCheckRequest(service=service),
                                      timeout=RPC_TIMEOUT_S).status

    def alive(self):
        return self.proc.poll() is None

    def kill(self):
        """SIGKILL: no shutdown path runs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._close()

    def stop(self, expect_rc=0):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=90)
        self._close()
        if expect_rc is not None:
            assert rc == expect_rc, "%s exited with %d after SIGTERM:\n%s" % (
                self.name, rc, tail(self.log_path))
        return rc

    def wait_exit(self, timeout_s=START_TIMEOUT_S):
        rc = self.proc.wait(timeout=timeout_s)
        self._close()
        return rc

    def _close(self):
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if not self.log_file.closed:
            self.log_file.close()

    def log_text(self):
        return read_text(self.log_path)


class ProviderSim:
    """//sim:provider_sim on port 0; admin over HTTP."""

    def __init__(self, binary, workdir, flags):
        self.log_path = os.path.join(workdir, "provider_sim.log")
        self.out_path = os.path.join(workdir, "provider_sim.out")
        self.out = open(self.out_path, "wb")
        self.err = open(self.log_path, "wb")
        self.proc = subprocess.Popen([binary, "--port=0"] + list(flags),
                                     stdout=self.out, stderr=self.err)

        def listening():
            if self.proc.poll() is not None:
                raise AssertionError("provider_sim exited: " + tail(self.log_path))
            for line in read_text(self.out_path).splitlines():
                if line.startswith("provider_sim listening on "):
                    return line.split()[-1]
            return False

        self.base_url = wait_until("provider_sim listening", listening, START_TIMEOUT_S)

    def _req(self, path, post=False):
        req = urllib.request.Request(self.base_url + path, data=b"" if post else None,
                                     method="POST" if post else "GET")
        with urllib.request.urlopen(req, timeout=RPC_TIMEOUT_S) as r:
            return json.loads(r.read().decode() or "{}")

    def status(self):
        return self._req("/sim/status")

    def admin(self, path):
        return self._req("/sim/admin/" + path, post=True)

    def canonical(self, frm, to):
        """Canonical logs of blocks [frm, to] as {(block, log_index): block_hash}."""
        out = {}
        step = 2000
        b = frm
        while b <= to:
            e = min(to, b + step - 1)
            page = self._req("/sim/canonical?from=%d&to=%d" % (b, e))
            for item in page["items"]:
                out[(int(item["blockNumber"], 16), int(item["logIndex"], 16))] = \
                    item["blockHash"].lower()
            b = e + 1
        return out

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.out.close()
        self.err.close()


class SampleSink:
    """//sim/sample_sink:sample_sink on port 0 with its own durable table."""

    def __init__(self, binary, workdir, name, flags=()):
        self.name = name
        self.port_file = os.path.join(workdir, name + ".sinkport")
        self.log_path = os.path.join(workdir, name + ".log")
        self.log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "--port=0", "--port_file=" + self.port_file,
             "--db_path=" + os.path.join(workdir, name + ".db")] + list(flags),
            stdout=self.log_file, stderr=subprocess.STDOUT)

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError("%s exited: %s" % (name, tail(self.log_path)))
            return os.path.exists(self.port_file) and read_text(self.port_file).strip()

        self.port = int(wait_until(name + " port file", ready, START_TIMEOUT_S))
        self.target = "127.0.0.1:%d" % self.port
        import grpc
        import sample_sink_admin_pb2_grpc
        self.channel = grpc.insecure_channel(self.target)
        self.admin = sample_sink_admin_pb2_grpc.SampleSinkAdminStub(self.channel)

    def set_faults(self, config):
        import sample_sink_admin_pb2 as sa
        self.admin.SetFaults(sa.SetFaultsRequest(faults=config), timeout=RPC_TIMEOUT_S)

    def records(self):
        import sample_sink_admin_pb2 as sa
        return list(self.admin.ListRecords(sa.ListRecordsRequest(), timeout=60).records)

    def stats(self):
        import sample_sink_admin_pb2 as sa
        return self.admin.GetStats(sa.GetStatsRequest(), timeout=RPC_TIMEOUT_S)

    def stop(self):
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.log_file.close()

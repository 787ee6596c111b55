#!/usr/bin/python3
"""Process-level storage tests of the real handoffd (issue 8, "Storage faults").

1. A corrupted or foreign data directory is refused at start: handoffd exits non-zero
   and its message names the directory. Cases: a Handoff database whose CURRENT and
   MANIFEST were overwritten with garbage; a RocksDB database of another program (the
   sample sink's idempotency table); a `db` directory holding unrelated files; a data
   directory that is a regular file.
2. A real small filesystem that fills up: the data directory on a size-capped tmpfs
   (needs root and mount(2); otherwise SKIPPED with a message). The local-rows source
   halts as SOURCE_STATE_STORAGE_FAILED with a "No space" error, grpc.health.v1 turns
   NOT_SERVING, the checkpoint stops moving; then the tmpfs is enlarged
   (mount -o remount,size=...), handoffd restarted, and the source resumes and catches
   up with rows equal to the simulator's canonical chain.

  handoffd_storage_test.py --handoffd=P --provider_sim=P --sample_sink=P --proto_dir=D
      --sink_proto_dir=D --procs_dir=D
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    for flag in ("handoffd", "provider_sim", "sample_sink", "proto_dir", "sink_proto_dir",
                 "procs_dir"):
        ap.add_argument("--" + flag, required=True)
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.procs_dir))
    global procs, log, wait_until
    import procs
    from procs import log, wait_until
    workdir = tempfile.mkdtemp(prefix="storage-", dir=os.environ.get("TEST_TMPDIR"))
    procs.generate_stubs(args.proto_dir, os.path.join(workdir, "stubs"), args.sink_proto_dir)
    refused_at_start(args, workdir)
    disk_full(args, workdir)
    log("PASSED")
    return 0


def expect_refused(args, workdir, name, data_dir, why):
    server = procs.Handoffd(args.handoffd, workdir, name, data_dir, wait_ready=False)
    rc = server.wait_exit()
    text = server.log_text()
    assert rc != 0, "%s: handoffd started on %s (rc 0):\n%s" % (name, why, text)
    assert not os.path.exists(server.port_file), "%s: handoffd wrote its port file" % name
    assert data_dir in text, "%s: the message does not name %s:\n%s" % (name, data_dir, text)
    line = [l for l in text.splitlines() if data_dir in l][0]
    log("ok - %s refused (exit %d): %s" % (why, rc, line[:300]))


def refused_at_start(args, workdir):
    # A real Handoff database first (created, then stopped gracefully).
    good = os.path.join(workdir, "good")
    server = procs.Handoffd(args.handoffd, workdir, "good", good)
    server.stop()
    # Corrupted: CURRENT and every MANIFEST overwritten with garbage.
    corrupt = os.path.join(workdir, "corrupt")
    shutil.copytree(good, corrupt)
    db = os.path.join(corrupt, "db")
    for f in os.listdir(db):
        if f == "CURRENT" or f.startswith("MANIFEST"):
            with open(os.path.join(db, f), "wb") as out:
                out.write(b"\x00garbage\xff" * 64)
    expect_refused(args, workdir, "corrupt", corrupt, "a corrupted database")
    # Foreign: another program's RocksDB (the sample sink's idempotency table).
    foreign = os.path.join(workdir, "foreign")
    os.makedirs(foreign)
    sink = procs.SampleSink(args.sample_sink, workdir, "foreign-sink",
                            ["--db_path=" + os.path.join(foreign, "db")])
    from handoff.v1 import event_sink_pb2, event_sink_pb2_grpc
    event = event_sink_pb2.ApplyRequest(source_id="x", idempotency_key="x/0x01/0")
    event.event.block_number = 1
    event_sink_pb2_grpc.EventSinkStub(sink.channel).Apply(event, timeout=20)
    assert sink.stats().records == 1
    sink.stop()
    expect_refused(args, workdir, "foreign", foreign,
                   "another program's RocksDB database (one record)")
    # Not a database at all: unrelated files where the database should be.
    junk = os.path.join(workdir, "junk")
    os.makedirs(os.path.join(junk, "db"))
    with open(os.path.join(junk, "db", "notes.txt"), "w") as f:
        f.write("not a database\n")
    expect_refused(args, workdir, "junk", junk, "a directory of unrelated files")
    # The data directory is a regular file.
    afile = os.path.join(workdir, "afile")
    with open(afile, "w") as f:
        f.write("x")
    expect_refused(args, workdir, "afile", afile, "a data directory that is a file")
    # The untouched database still opens (the refusals changed nothing).
    procs.Handoffd(args.handoffd, workdir, "good-again", good).stop()
    log("ok - the good database still opens")


def mount_tmpfs(path, size):
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=" + size, "tmpfs", path],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def disk_full(args, workdir):
    import grpc
    from handoff.v1 import consumer_admin_pb2 as admin
    from handoff.v1 import source_pb2 as s
    from health_v1 import health_pb2

    mnt = os.path.join(workdir, "small")
    os.makedirs(mnt)
    if os.geteuid() != 0:
        log("SKIPPED - disk full on a real filesystem: not root (cannot mount a tmpfs)")
        return
    r = mount_tmpfs(mnt, "6m")
    if r.returncode != 0:
        log("SKIPPED - disk full on a real filesystem: mount -t tmpfs failed: %s" %
            r.stdout.decode(errors="replace").strip())
        return
    sim = server = None
    try:
        logs = 40
        sim = procs.ProviderSim(args.provider_sim, workdir, [
            "--initial_head=1500", "--logs_per_block=%d" % logs, "--heartbeat_ms=1000"])
        head = sim.status()["head"]
        data_dir = os.path.join(mnt, "handoff")
        server = procs.Handoffd(args.handoffd, workdir, "full.1", data_dir)
        spec = s.SourceSpec(id="rows", provider_url=sim.base_url, chain="sim", source="rows",
                            filter="all", transport=s.TRANSPORT_POLL, page_limit=1000)
        spec.start.block = 0
        spec.sink.local_rows.SetInParent()
        server.call("CreateSource", admin.CreateSourceRequest(spec=spec, start=True))

        def progress():
            return server.call("GetProgress", admin.GetProgressRequest(source_id="rows"))

        def halted_or_dead():
            if not server.alive():
                return "dead"
            try:
                p = progress()
            except grpc.RpcError:
                return "dead" if not server.alive() else None
            return p if p.state == s.SOURCE_STATE_STORAGE_FAILED else None

        p = wait_until("STORAGE_FAILED on the full tmpfs", halted_or_dead, 120)
        df = subprocess.run(["df", "-k", mnt], stdout=subprocess.PIPE).stdout.decode()
        halted = None
        if p == "dead":
            # Debian's librocksdb is built with assertions and aborts once a WAL write
            # met ENOSPC; the store therefore keeps a free-space reserve and refuses the
            # write first (StoreOptions::min_free_disk_bytes). Dying here is a failure.
            server.wait_exit()
            last = server.log_text().strip().splitlines()[-1]
            raise AssertionError("handoffd died on a full disk instead of STORAGE_FAILED: "
                                 "%s\n%s" % (last, df.strip()))
        log("ok - STORAGE_FAILED: reason %r, last_error %d %r (applied %d:%d)\n%s" % (
            p.reason, p.last_error.code, p.last_error.message, p.checkpoint.applied_block,
            p.checkpoint.applied_log_index, df.strip()))
        assert "full" in p.last_error.message.lower() or \
            "space" in p.last_error.message.lower(), p.last_error.message
        assert p.checkpoint.applied_block < head, "the disk did not fill up before the end"
        wait_until("health NOT_SERVING", lambda: server.health("") ==
                   health_pb2.HealthCheckResponse.NOT_SERVING, 30)
        probe = grpc.insecure_channel("127.0.0.1:%d" % server.health_port)
        from health_v1 import health_pb2_grpc
        st = health_pb2_grpc.HealthStub(probe).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=10).status
        probe.close()
        assert st == health_pb2.HealthCheckResponse.NOT_SERVING, st
        log("ok - grpc.health.v1 NOT_SERVING (admin port and probe port)")
        halted = p.checkpoint
        again = progress()
        assert again.checkpoint == halted, "the checkpoint moved after STORAGE_FAILED"
        # The process stops (SIGTERM; its exit code may report the failure).
        rc = server.stop(expect_rc=None)
        log("ok - handoffd stopped with exit code %d after the storage failure" % rc)

        # The operator frees space: the tmpfs grows. Then the process restarts.
        r = subprocess.run(["mount", "-o", "remount,size=512m", mnt], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT)
        assert r.returncode == 0, r.stdout
        server = procs.Handoffd(args.handoffd, workdir, "full.2", data_dir)
        cp = progress().checkpoint
        if halted is not None:
            assert cp.checkpoint_version >= halted.checkpoint_version, (cp, halted)
            assert (cp.applied_block, cp.applied_log_index) >= (halted.applied_block,
                                                                halted.applied_log_index)
        wait_until("the source to catch up after the restart",
                   lambda: (progress().checkpoint.applied_block, progress().checkpoint
                            .applied_log_index) == (head, logs - 1), 180, 0.1)
        wait_until("health SERVING", lambda: server.health("") ==
                   health_pb2.HealthCheckResponse.SERVING, 30)
        canon = sim.canonical(0, head)
        rows, token = {}, ""
        while True:
            resp = server.call("QueryEvents", admin.QueryEventsRequest(
                source_id="rows", page_size=2000, page_token=token))
            for row in resp.rows:
                rows[(row.block_number, row.log_index)] = row.block_hash.lower()
            token = resp.next_page_token
            if not token:
                break
        assert rows == canon, "rows differ from the canonical chain: %d vs %d" % (
            len(rows), len(canon))
        log("ok - after enlarging the tmpfs and a restart: resumed, %d rows equal the "
            "canonical chain, SERVING" % len(rows))
        server.stop()
        server = None
    finally:
        if server is not None and server.alive():
            server.kill()
        if sim is not None:
            sim.stop()
        subprocess.run(["umount", "-l", mnt])


if __name__ == "__main__":
    sys.exit(main())

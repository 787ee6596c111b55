#!/usr/bin/python3
"""End-to-end flow of the real binaries with a client Handoff did not write.

  full_flow_e2e.py --handoffd=PATH --provider_sim=PATH --sample_sink=PATH --proto_dir=DIR

The provider simulator (bearer token required), the sample downstream sink (asks for
review of block 120) and handoffd (token roles, metrics) run as separate processes. A
python3-grpcio client creates and starts sources, watches progress, meets the holds,
resolves them and sees the barrier advance, stops a source, SIGKILLs the process,
restarts it and checks that every source resumed from its checkpoint with nothing lost
or applied twice: the rows equal the simulator's canonical chain, the sink recorded each
idempotency key once, and no secret appears in a log or a reply.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import handoffd_e2e as e2e  # noqa: E402  (shared helpers: stubs, Handoffd, Client)

PROVIDER_KEY = "sim-provider-key-5b8e1d0c7a"
OPERATOR = "flow-operator-token-0e9d8c7b6a"
READER = "flow-reader-token-1a2b3c4d5e"
HEAD = 260
REVIEW_BLOCK = 120


def canonical(sim_url, start):
    url = "%s/sim/canonical?from=%d&to=%d" % (sim_url, start, HEAD)
    body = json.loads(urllib.request.urlopen(url, timeout=20).read())
    return [(int(i["blockNumber"], 16), int(i["logIndex"], 16), i["blockHash"])
            for i in body["items"]]


def rows(client, admin, source_id):
    out, token = [], ""
    while True:
        r = client.call("QueryEvents", admin.QueryEventsRequest(
            source_id=source_id, page_size=500, page_token=token))
        out += [(x.block_number, x.log_index, x.block_hash) for x in r.rows]
        token = r.next_page_token
        if not token:
            return out


def main():
    a, work = e2e.procs.setup_sink_test()
    import grpc
    from handoff.v1 import consumer_admin_pb2 as admin, source_pb2 as src
    import sample_sink_admin_pb2 as sink_admin
    import sample_sink_admin_pb2_grpc as sink_admin_grpc

    procs = []
    servers = []  # every handoffd incarnation, killed on the way out whatever happened
    try:
        os.environ["SIM_TOKEN"] = PROVIDER_KEY  # read by the simulator (port 0) only
        sim = e2e.procs.ProviderSim(a.provider_sim, work, [
            "--chain=sim", "--initial_head=%d" % HEAD, "--logs_per_block=3",
            "--finality_lag=5", "--safe_lag=2", "--heartbeat_ms=500",
            "--bearer_token_env=SIM_TOKEN"])
        procs.append(sim.proc)
        sink_port_file = os.path.join(work, "sink.port")
        procs.append(subprocess.Popen(
            [a.sample_sink, "--port_file=" + sink_port_file, "--db_path=" + work + "/sink",
             "--review_blocks=%d" % REVIEW_BLOCK],
            stdout=open(os.path.join(work, "sink.log"), "wb"), stderr=subprocess.STDOUT))
        e2e.wait_until("sample sink port", lambda: os.path.exists(sink_port_file))
        sink_target = "127.0.0.1:" + open(sink_port_file).read().split()[-1]

        tokens = os.path.join(work, "tokens")
        with open(tokens, "w") as f:
            f.write("ops operator %s\nviewer reader %s\n" % (OPERATOR, READER))
        data = os.path.join(work, "data")
        os.environ["PROVIDER_KEY"] = PROVIDER_KEY  # inherited by handoffd only
        flags = ["--auth_tokens_file=" + tokens]
        server = e2e.Handoffd(a.handoffd, work, "flow-1", data, flags)
        servers.append(server)
        op = e2e.Client(grpc.insecure_channel(server.target), OPERATOR)
        viewer = e2e.Client(grpc.insecure_channel(server.target), READER)

        def spec(source_id, transport, sink):
            s = src.SourceSpec(id=source_id, provider_url=sim.base_url,
                               chain="sim", source="logs", filter="all", transport=transport,
                               page_limit=50)
            s.start.block = 100
            s.api_key.env = "PROVIDER_KEY"
            if sink:
                s.sink.downstream.target = sink_target
                s.sink.downstream.batch = True
                s.sink.gate = src.DELIVERY_GATE_IMMEDIATE
                s.failure_policy.on_rejection = src.REJECTION_POLICY_HOLD
            else:
                s.sink.local_rows.SetInParent()
            return s

        # 1. A source with downstream deliveries meets the review holds of block 120.
        op.call("CreateSource", admin.CreateSourceRequest(
            spec=spec("flow", src.TRANSPORT_POLL, True), start=True))
        stream = viewer.admin.WatchProgress(
            admin.WatchProgressRequest(source_id="flow", heartbeat_ms=200),
            metadata=viewer.metadata, timeout=60)
        blocked = None
        for progress in stream:
            if progress.state == src.SOURCE_STATE_BLOCKED_ON_HOLD:
                blocked = progress
                break
        stream.cancel()
        assert blocked is not None
        assert blocked.attempt.first_blocking_event.block_number == REVIEW_BLOCK, blocked
        assert blocked.checkpoint.applied_block < REVIEW_BLOCK or (
            blocked.checkpoint.applied_block == REVIEW_BLOCK), blocked
        cursor_before = blocked.checkpoint.resume_cursor
        e2e.log("ok - watched the source reach BLOCKED_ON_HOLD at block %d" % REVIEW_BLOCK)

        # 2. Readers may not resolve; operators resolve each hold; the barrier advances.
        holds = viewer.call("ListHolds", admin.ListHoldsRequest(source_id="flow")).holds
        assert holds and all(h.event.block_number == REVIEW_BLOCK for h in holds), holds
        first = holds[0]
        req = admin.ResolveHoldRequest(
            source_id="flow", stage=first.stage, block_number=first.event.block_number,
            log_index=first.event.log_index, decision=admin.HOLD_DECISION_IGNORE,
            reason="e2e: known bad", hold_version=first.version)
        e2e.expect_code(grpc.StatusCode.PERMISSION_DENIED, viewer.call, "ResolveHold", req)
        stale = admin.ResolveHoldRequest()
        stale.CopyFrom(req)
        stale.hold_version = first.version + 5
        e2e.expect_code(grpc.StatusCode.ABORTED, op.call, "ResolveHold", stale)
        resolved = 0
        resolutions = []  # (block, log index, hold version, kind, reason), for the report
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            holds = op.call("ListHolds", admin.ListHoldsRequest(source_id="flow")).holds
            if not holds:
                p = op.call("GetProgress", admin.GetProgressRequest(source_id="flow"))
                if p.checkpoint.resume_cursor != cursor_before:
                    break
                time.sleep(0.05)
                continue
            for h in holds:
                r = op.call("ResolveHold", admin.ResolveHoldRequest(
                    source_id="flow", stage=h.stage, block_number=h.event.block_number,
                    log_index=h.event.log_index, decision=admin.HOLD_DECISION_QUARANTINE
                    if h.event.log_index % 2 else admin.HOLD_DECISION_IGNORE,
                    reason="e2e: operator decision", hold_version=h.version))
                assert r.record.actor == "ops", r.record  # the token's name, never the token
                resolved += 1
                resolutions.append((h.event.block_number, h.event.log_index, h.version,
                                    h.kind, h.reason))
        assert resolved >= 1
        q = viewer.call("ListQuarantine", admin.ListQuarantineRequest(source_id="flow")).records
        assert len(q) == resolved and all(x.actor == "ops" for x in q), (resolutions, q)
        e2e.log("ok - resolved %d holds; the barrier advanced past block %d" %
                (resolved, REVIEW_BLOCK))

        # Metrics of this incarnation, which has committed pages (a restarted process
        # that finds nothing new commits none, and counters appear with their first use).
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % server.metrics_port,
                                      timeout=20).read().decode()
        for name in ("handoff_events_applied_total", "handoff_pages_committed_total",
                     "handoff_commit_latency_seconds", "handoff_open_holds",
                     "handoff_finalized_block", "handoff_lag_blocks"):
            assert name in text, "metrics lack " + name

        # 3. A second source over SSE; stop the first; SIGKILL mid-run; restart.
        op.call("CreateSource", admin.CreateSourceRequest(
            spec=spec("flow2", src.TRANSPORT_SSE, False), start=True))
        e2e.wait_until("flow2 progress", lambda: op.call(
            "GetProgress", admin.GetProgressRequest(source_id="flow2")).counters.applied > 0, 60)
        op.call("StopSource", admin.StopSourceRequest(source_id="flow"))
        before_kill = op.call("GetProgress", admin.GetProgressRequest(source_id="flow"))
        server.kill()
        e2e.log("ok - SIGKILL")
        server = e2e.Handoffd(a.handoffd, work, "flow-2", data, flags)
        servers.append(server)
        op = e2e.Client(grpc.insecure_channel(server.target), OPERATOR)
        after = op.call("GetProgress", admin.GetProgressRequest(source_id="flow"))
        assert after.state == src.SOURCE_STATE_STOPPED, after
        assert after.checkpoint.resume_cursor == before_kill.checkpoint.resume_cursor
        op.call("StartSource", admin.StartSourceRequest(source_id="flow"))

        def caught_up(source_id):
            p = op.call("GetProgress", admin.GetProgressRequest(source_id=source_id))
            return p.checkpoint.applied_block >= HEAD and not p.attempt.events_total
        e2e.wait_until("flow caught up", lambda: caught_up("flow"), 120)
        e2e.wait_until("flow2 caught up (resumed by itself)", lambda: caught_up("flow2"), 120)

        # 4. Nothing lost, nothing applied twice.
        truth = canonical(sim.base_url, 100)
        for source_id in ("flow", "flow2"):
            got = rows(op, admin, source_id)
            assert got == truth, "%s: %d rows, canonical has %d" % (source_id, len(got), len(truth))
        sink = sink_admin_grpc.SampleSinkAdminStub(grpc.insecure_channel(sink_target))
        records = sink.ListRecords(sink_admin.ListRecordsRequest(), timeout=20).records
        keys = [r.idempotency_key for r in records]
        assert len(keys) == len(set(keys))
        delivered = {(r.block_number, r.log_index) for r in records}
        expected = {(b, i) for (b, i, _) in truth if b != REVIEW_BLOCK}
        assert delivered == expected, (len(delivered), len(expected))
        e2e.log("ok - %d rows equal the canonical chain; %d deliveries, one per key" %
                (len(truth), len(keys)))

        # 5. Metrics and secrets.
        replies = str(op.call("ListSources", admin.ListSourcesRequest()))
        for secret in (PROVIDER_KEY, OPERATOR, READER):
            assert secret not in replies
            for log_name in ("flow-1.log", "flow-2.log"):
                assert secret not in e2e.read(os.path.join(work, log_name)).decode(
                    errors="replace"), "secret in " + log_name
        e2e.log("ok - metrics scraped; no secret in logs or replies")
        server.stop()
    finally:
        for server in servers:
            if server.alive():
                server.kill()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()

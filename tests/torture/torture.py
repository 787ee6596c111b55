#!/usr/bin/python3
"""Process-level crash torture of handoffd (issue 8, "Process-level crash torture").

Runs the real handoffd against the real provider simulator (reorgs and faults on:
truncated bodies, 503 chain_unavailable, dropped connections, overlapping pages,
incomplete SSE frames) and three real sample sinks, with five sources at once:

  rows-poll   local rows, POLL
  rows-sse    local rows, SSE
  imm-quar    downstream IMMEDIATE; the sink REJECTS every event of blocks = 3 mod 10,
              and the policy turns each rejection into a durable quarantine receipt
  fin         downstream FINALIZED gate (batch); the sink fails calls now and then
  review      downstream IMMEDIATE; the sink asks NEEDS_REVIEW for a few chosen events,
              so operator holds exist and block the barrier until resolved

It kills handoffd with SIGKILL at seeded random moments, restarts it, and checks:

  (a) materialized rows (QueryEvents) == the simulator's canonical chain up to each
      local-rows source's applied position (at the end, caught up to a fixed head);
  (b) every finalized event was delivered to the FINALIZED sink exactly once per
      idempotency key (one record per key and per position, attempts may be > 1), and
      no event that was reorged away was ever delivered there; the IMMEDIATE sinks hold
      a record or a quarantine/ignore receipt for every canonical event;
  (c) no checkpoint moved past a non-terminal event: a poller records every checkpoint
      it observes (GetProgress every few ms); checkpoint versions never go back across
      kills, one version always names one cursor, rows snapshots (QueryEvents returns
      the checkpoint with the rows) are complete below the applied position, and every
      position below the highest applied position observed for a downstream source has
      a receipt (a sink record or a quarantine/ignore record);
  (d) operator-review holds and quarantine records observed before a kill are
      unchanged after the restart, and resolving a hold after a restart works
      (QUARANTINE / IGNORE unblock the barrier; RETRY re-drives the event).

  torture.py --handoffd=P --provider_sim=P --sample_sink=P --proto_dir=D --sink_proto_dir=D
Environment: HANDOFF_TORTURE_KILLS (default 25), HANDOFF_TORTURE_SEED (1),
HANDOFF_TORTURE_MAX_SECONDS (time budget of the kill phase, default 150),
HANDOFF_TORTURE_REPORT (append a Markdown figures section to this file),
HANDOFF_TORTURE_WORKDIR (default TEST_TMPDIR or a fresh temporary directory).
"""

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "testing"))
import procs  # noqa: E402
from procs import log, wait_until  # noqa: E402

START = 220          # every source starts at this block
INITIAL_HEAD = 300
LOGS = 4             # logs per block (log_index 0..3)
FINALITY_LAG = 32
SAFE_LAG = 6
REJECT_MOD, REJECT_REM = 10, 3            # imm-quar: blocks = 3 (mod 10) are rejected
# Final at the start (head 300, finality lag 32), so their identities never change.
REVIEW_EVENTS = [(225, 1), (235, 2), (245, 3), (250, 0), (258, 1), (265, 2)]
SOURCES = ["rows-poll", "rows-sse", "imm-quar", "fin", "review"]
ROWS_SOURCES = ["rows-poll", "rows-sse"]


class Violations:
    def __init__(self):
        self.lock = threading.Lock()
        self.items = []

    def add(self, msg):
        with self.lock:
            if len(self.items) < 200:
                log("VIOLATION: " + msg)
            self.items.append(msg)

    def count(self):
        with self.lock:
            return len(self.items)


class Figures(dict):
    def bump(self, key, n=1):
        self[key] = self.get(key, 0) + n


def pos_le(a, b):
    return a <= b


def applied_of(cp):
    return (cp.applied_block, cp.applied_log_index) if cp.has_applied else None


class Poller(threading.Thread):
    """Observes every source's checkpoints as often as it can, across incarnations."""

    def __init__(self, state, violations, figures):
        super().__init__(daemon=True)
        self.state = state
        self.v = violations
        self.f = figures
        self.stop_flag = threading.Event()
        self.last_version = {}      # (source, stage) -> highest version seen
        self.cursor_of = {}         # (source, stage, version) -> resume cursor
        self.max_applied = {}       # (source, stage) -> highest applied position seen
        self.lock = threading.Lock()

    def observe(self, src, stage, cp, inc):
        key = (src, stage)
        v = cp.checkpoint_version
        with self.lock:
            last = self.last_version.get(key)
            if last is not None and v < last[0]:
                self.v.add("%s %s checkpoint version went back from %d (incarnation %d) to %d "
                           "(incarnation %d)" % (src, stage, last[0], last[1], v, inc))
            if last is None or v > last[0]:
                self.last_version[key] = (v, inc)
            ck = (src, stage, v)
            prev = self.cursor_of.get(ck)
            if prev is None:
                self.cursor_of[ck] = cp.resume_cursor
            elif prev != cp.resume_cursor:
                self.v.add("%s %s version %d names two cursors: %r and %r" %
                           (src, stage, v, prev, cp.resume_cursor))
            a = applied_of(cp)
            if a is not None and (key not in self.max_applied or a > self.max_applied[key]):
                self.max_applied[key] = a
        self.f.bump("checkpoint observations")

    def check_rows_snapshot(self, server, src):
        """QueryEvents returns the checkpoint it read before the rows: every position at
        or below its applied position must have a row, one hash per block."""
        from handoff.v1 import consumer_admin_pb2 as admin
        resp = server.call("QueryEvents", admin.QueryEventsRequest(
            source_id=src, from_block=START, page_size=10000), timeout=5)
        cp = resp.checkpoint
        self.observe(src, "ingest", cp, self.state.incarnation)
        if not cp.has_applied:
            return
        applied = (cp.applied_block, cp.applied_log_index)
        rows = {(r.block_number, r.log_index): r.block_hash.lower() for r in resp.rows}
        last_row = max(rows) if rows else None
        limit = applied if not resp.next_page_token else min(applied, last_row)
        hashes = {}
        for b in range(START, limit[0] + 1):
            for i in range(LOGS):
                if (b, i) > limit:
                    break
                h = rows.get((b, i))
                if h is None:
                    self.v.add("%s: no row at %d:%d below applied position %d:%d (checkpoint "
                               "v%d)" % (src, b, i, applied[0], applied[1],
                                         cp.checkpoint_version))
                    return
                if hashes.setdefault(b, h) != h:
                    self.v.add("%s: block %d has rows of two hashes" % (src, b))
                    return
                self.f.bump("receipts checked below observed checkpoints")
        self.f.bump("rows snapshots checked")

    def run(self):
        from handoff.v1 import consumer_admin_pb2 as admin
        n = 0
        while not self.stop_flag.is_set():
            server = self.state.server
            inc = self.state.incarnation
            if server is None or server.channel is None:
                time.sleep(procs.POLL_S)
                continue
            try:
                for src in SOURCES:
                    p = server.call("GetProgress", admin.GetProgressRequest(source_id=src),
                                    timeout=2)
                    self.observe(src, "ingest", p.checkpoint, inc)
                    if p.HasField("delivery_checkpoint"):
                        self.observe(src, "delivery", p.delivery_checkpoint, inc)
                n += 1
                if n % 8 == 0:
                    for src in ROWS_SOURCES:
                        self.check_rows_snapshot(server, src)
            except Exception:  # the server is being killed or restarted
                time.sleep(procs.POLL_S)


class ChainTicker(threading.Thread):
    """The workload: one new block every 100 ms and, now and then, a reorg of 1..6 blocks
    (always shallower than the finality lag). Pacing, not synchronisation."""

    def __init__(self, sim, rng, figures):
        super().__init__(daemon=True)
        self.sim, self.rng, self.f = sim, rng, figures
        self.stop_flag = threading.Event()

    def run(self):
        while not self.stop_flag.wait(0.1):
            try:
                self.sim.admin("advance?blocks=1")
                self.f.bump("blocks produced")
                if self.rng.random() < 0.15:
                    self.sim.admin("reorg?depth=%d" % self.rng.randint(1, 6))
                    self.f.bump("reorgs")
            except Exception as e:  # noqa: BLE001
                log("ticker: %s" % e)


class State:
    def __init__(self):
        self.server = None
        self.incarnation = 0


def make_specs(sim, sinks):
    from handoff.v1 import source_pb2 as s

    def base(sid, transport, limit):
        spec = s.SourceSpec(id=sid, provider_url=sim.base_url, chain="sim", source=sid,
                            filter="all", transport=transport, page_limit=limit)
        spec.start.block = START
        spec.failure_policy.max_attempts = 1000
        spec.failure_policy.initial_backoff_ms = 20
        spec.failure_policy.max_backoff_ms = 300
        return spec

    specs = []
    sp = base("rows-poll", s.TRANSPORT_POLL, 20)
    sp.sink.local_rows.SetInParent()
    specs.append(sp)
    sp = base("rows-sse", s.TRANSPORT_SSE, 40)
    sp.sink.local_rows.SetInParent()
    specs.append(sp)
    sp = base("imm-quar", s.TRANSPORT_POLL, 16)
    sp.sink.downstream.target = sinks["imm-quar"].target
    sp.sink.downstream.deadline_ms = 5000
    sp.sink.gate = s.DELIVERY_GATE_IMMEDIATE
    sp.failure_policy.on_rejection = s.REJECTION_POLICY_QUARANTINE
    specs.append(sp)
    sp = base("fin", s.TRANSPORT_SSE, 24)
    sp.sink.downstream.target = sinks["fin"].target
    sp.sink.downstream.deadline_ms = 5000
    sp.sink.downstream.batch = True
    sp.sink.downstream.max_batch = 32
    sp.sink.gate = s.DELIVERY_GATE_FINALIZED
    specs.append(sp)
    sp = base("review", s.TRANSPORT_POLL, 16)
    sp.sink.downstream.target = sinks["review"].target
    sp.sink.downstream.deadline_ms = 5000
    sp.sink.downstream.batch = True
    sp.sink.gate = s.DELIVERY_GATE_IMMEDIATE
    sp.failure_policy.on_rejection = s.REJECTION_POLICY_HOLD
    specs.append(sp)
    return specs


def list_all(server, method, request_cls, field, **kw):
    out, token = [], ""
    while True:
        resp = server.call(method, request_cls(page_token=token, page_size=1000, **kw))
        out.extend(getattr(resp, field))
        token = resp.next_page_token
        if not token:
            return out


def hold_key(h):
    return (h.source_id, h.stage, h.event.block_number, h.event.log_index)


def snapshot(server):
    from handoff.v1 import consumer_admin_pb2 as admin
    holds = {hold_key(h): h for h in
             list_all(server, "ListHolds", admin.ListHoldsRequest, "holds")}
    quarantine = {}
    for src in SOURCES:
        for r in list_all(server, "ListQuarantine", admin.ListQuarantineRequest, "records",
                          source_id=src):
            quarantine[(r.source_id, r.stage, r.event.block_number, r.event.log_index,
                        r.event.block_hash)] = r
    return holds, quarantine


def check_restart(before, after, violations, figures, sim):
    """(d): operator-review holds and quarantine records survive a kill unchanged.

    A record of an identity that a reorg has since orphaned may be gone: a correction
    page deletes the receipts, quarantine records and holds at the positions it replaces
    (PageAttempt::StageOrphans), and the engine keeps running between the snapshot and
    the kill and after the restart. Only records whose identity is still canonical must
    survive."""
    from handoff.v1 import source_pb2 as s
    holds_b, quar_b = before
    holds_a, quar_a = after
    canon = {}

    def canonical(block, log_index):
        if block not in canon:
            c = sim.canonical(block, block)
            canon[block] = {p[1]: h for p, h in c.items()}
        return canon[block].get(log_index)

    for k, h in holds_b.items():
        if h.kind != s.HOLD_KIND_OPERATOR_REVIEW:
            continue  # RETRYING holds are re-driven by the worker itself
        a = holds_a.get(k)
        if a is None:
            if canonical(k[2], k[3]) != h.event.block_hash.lower():
                figures.bump("holds of orphaned events removed by a correction")
            else:
                violations.add("hold %s vanished across a restart" % (k,))
            continue
        if (a.version, a.kind, a.event.block_hash, a.reason, a.event_row.SerializeToString()) != \
                (h.version, h.kind, h.event.block_hash, h.reason,
                 h.event_row.SerializeToString()):
            violations.add("hold %s changed across a restart: %s -> %s" % (k, h, a))
            continue
        figures.bump("holds verified across restarts")
    for k, r in quar_b.items():
        a = quar_a.get(k)
        if a is not None and a.SerializeToString() == r.SerializeToString():
            figures.bump("quarantine records verified across restarts")
            continue
        if a is None and canonical(k[2], k[3]) != k[4].lower():
            figures.bump("quarantine records of orphaned events removed by a correction")
            continue
        violations.add("quarantine record %s changed or vanished across a restart" % (k,))


def progress(server, src):
    from handoff.v1 import consumer_admin_pb2 as admin
    return server.call("GetProgress", admin.GetProgressRequest(source_id=src))


def resolve_one(server, hold, decision, violations, figures, reason):
    """Resolves `hold` and waits for its effect: QUARANTINE/IGNORE write a terminal
    receipt and the barrier moves past the event; RETRY re-drives it (the sink asks for
    review again, so the hold comes back with a newer version)."""
    import grpc
    from handoff.v1 import consumer_admin_pb2 as admin
    from handoff.v1 import source_pb2 as s
    ev = hold.event
    req = admin.ResolveHoldRequest(source_id=hold.source_id, stage=hold.stage,
                                   block_number=ev.block_number, log_index=ev.log_index,
                                   decision=decision, reason=reason,
                                   hold_version=hold.version)
    resp = server.call("ResolveHold", req)
    figures.bump("holds resolved")
    pos = (ev.block_number, ev.log_index)
    get = admin.GetHoldRequest(source_id=hold.source_id, stage=hold.stage,
                               block_number=ev.block_number, log_index=ev.log_index)
    if decision == admin.HOLD_DECISION_RETRY:
        def redriven():
            try:
                h = server.call("GetHold", get)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    return False
                raise
            return h.version > hold.version or h.last_seen_unix_ms > hold.last_seen_unix_ms
        wait_until("RETRY of hold %s to re-drive it" % (pos,), redriven, 30)
        figures.bump("holds re-driven by RETRY")
        return
    want = (s.DISPOSITION_QUARANTINED if decision == admin.HOLD_DECISION_QUARANTINE
            else s.DISPOSITION_IGNORED)
    if resp.record.disposition != want or resp.record.from_hold_version != hold.version:
        violations.add("ResolveHold answered %s for %s" % (resp.record, pos))

    def unblocked():
        p = progress(server, hold.source_id)
        a = applied_of(p.checkpoint)
        return a is not None and a >= pos
    wait_until("the barrier of %s to pass %s after %s" % (hold.source_id, pos, reason),
               unblocked, 60)
    figures.bump("barriers unblocked by a resolution after a restart")


def main():
    ap = argparse.ArgumentParser()
    for flag in ("handoffd", "provider_sim", "sample_sink", "proto_dir", "sink_proto_dir"):
        ap.add_argument("--" + flag, required=True)
    args = ap.parse_args()
    kills_wanted = int(os.environ.get("HANDOFF_TORTURE_KILLS", "25"))
    seed = int(os.environ.get("HANDOFF_TORTURE_SEED", "1"))
    budget_s = float(os.environ.get("HANDOFF_TORTURE_MAX_SECONDS", "150"))
    workdir = os.environ.get("HANDOFF_TORTURE_WORKDIR") or tempfile.mkdtemp(
        prefix="torture-", dir=os.environ.get("TEST_TMPDIR"))
    os.makedirs(workdir, exist_ok=True)
    rng = random.Random(seed)
    log("torture: seed=%d kills=%d budget=%.0fs workdir=%s" % (seed, kills_wanted, budget_s,
                                                              workdir))
    procs.generate_stubs(args.proto_dir, os.path.join(workdir, "stubs"), args.sink_proto_dir)
    import grpc
    import sample_sink_admin_pb2 as sa
    from handoff.v1 import consumer_admin_pb2 as admin
    from handoff.v1 import source_pb2 as s

    violations, figures = Violations(), Figures()
    t0 = time.monotonic()
    sim = procs.ProviderSim(args.provider_sim, workdir, [
        "--seed=%d" % seed, "--initial_head=%d" % INITIAL_HEAD, "--logs_per_block=%d" % LOGS,
        "--safe_lag=%d" % SAFE_LAG, "--finality_lag=%d" % FINALITY_LAG,
        "--heartbeat_ms=1000", "--retry_after=1",
        "--faults=truncated_body=0.02,chain_unavailable=0.01,drop_connection=0.02,"
        "overlapping_page=0.03,incomplete_sse_frame=0.02"])
    sinks = {name: procs.SampleSink(args.sample_sink, workdir, "sink-" + name)
             for name in ("imm-quar", "fin", "review")}
    canon0 = sim.canonical(START, INITIAL_HEAD)
    review_keys = ["review/%s/%d" % (canon0[p], p[1]) for p in REVIEW_EVENTS]
    cfg = sa.FaultConfig()
    cfg.reject.blocks.extend(b for b in range(START, 20000) if b % REJECT_MOD == REJECT_REM)
    sinks["imm-quar"].set_faults(cfg)
    cfg = sa.FaultConfig()
    cfg.review.idempotency_keys.extend(review_keys)
    sinks["review"].set_faults(cfg)

    data_dir = os.path.join(workdir, "handoff-data")
    state = State()

    def start_server():
        state.incarnation += 1
        srv = procs.Handoffd(args.handoffd, workdir, "handoffd.%d" % state.incarnation,
                             data_dir, ["--log_level=info"])
        state.server = srv
        return srv

    server = start_server()
    for spec in make_specs(sim, sinks):
        server.call("CreateSource", admin.CreateSourceRequest(spec=spec, start=True))
    poller = Poller(state, violations, figures)
    poller.start()
    ticker = ChainTicker(sim, random.Random(seed + 1), figures)
    ticker.start()

    kills = 0
    retried = set()
    n_resolutions = 0
    try:
        while kills < kills_wanted and time.monotonic() - t0 < budget_s:
            # After a restart: resolve a hold that survived it (at most one per incarnation).
            if state.incarnation > 1 and rng.random() < 0.7:
                holds, _ = snapshot(server)
                survivors = [h for k, h in sorted(holds.items())
                             if k in last_snapshot[0] and h.kind == s.HOLD_KIND_OPERATOR_REVIEW]
                if survivors:
                    h = survivors[0]
                    key = hold_key(h)
                    if key not in retried:
                        decision = admin.HOLD_DECISION_RETRY
                        retried.add(key)
                    else:
                        decision = (admin.HOLD_DECISION_QUARANTINE if n_resolutions % 2 == 0
                                    else admin.HOLD_DECISION_IGNORE)
                        n_resolutions += 1
                    resolve_one(server, h, decision, violations, figures,
                                "torture: resolved after restart %d" % kills)
            if kills % 4 == 2:
                # A flaky FINALIZED sink: the next calls fail, the dispatcher retries.
                cfg = sa.FaultConfig(fail_next_calls=rng.randint(1, 4),
                                     fail_mode=rng.choice([sa.FAIL_MODE_UNAVAILABLE,
                                                           sa.FAIL_MODE_RETRY_LATER]))
                sinks["fin"].set_faults(cfg)
            # The kill moment: a seeded random time after the restart (recovery included).
            time.sleep(rng.uniform(0.05, 2.0))
            last_snapshot = snapshot(server)
            time.sleep(rng.uniform(0, 0.05))
            server.kill()
            kills += 1
            server = start_server()
            check_restart(last_snapshot, snapshot(server), violations, figures, sim)
            if kills % 5 == 0:
                log("torture: %d kills, %.0fs, %d violations" % (
                    kills, time.monotonic() - t0, violations.count()))

        # ---- The end: a fixed chain, faults off, remaining holds resolved. ----
        ticker.stop_flag.set()
        ticker.join()
        sim.admin("faults/clear")
        sinks["fin"].set_faults(sa.FaultConfig())
        st = sim.status()
        head, finalized = st["head"], st["finalized"]
        log("torture: kill phase over after %d kills (%.0fs); head %d finalized %d" % (
            kills, time.monotonic() - t0, head, finalized))

        def caught_up():
            holds, _ = snapshot(server)
            for h in holds.values():
                if h.kind == s.HOLD_KIND_OPERATOR_REVIEW:
                    resolve_one(server, h, admin.HOLD_DECISION_QUARANTINE, violations, figures,
                                "torture: end of run")
            for src in SOURCES:
                p = progress(server, src)
                if applied_of(p.checkpoint) != (head, LOGS - 1):
                    return False
                if src == "fin" and applied_of(p.delivery_checkpoint) != (finalized, LOGS - 1):
                    return False
            return True
        wait_until("every source to catch up with head %d" % head, caught_up, 180, 0.2)
        # One last graceful restart: the final state is read from a fresh process.
        server.stop()
        server = start_server()
        final_progress = {src: progress(server, src) for src in SOURCES}
        poller.stop_flag.set()
        poller.join(10)

        # ---- Final checks against the canonical chain and the sinks' tables. ----
        # From START - 2: an overlapping first page (the overlapping_page fault) may
        # start two blocks below the start block; those events are real and final.
        canon = sim.canonical(START - 2, head)
        _, quarantine = snapshot(server)
        events_checked = 0
        for src in ROWS_SOURCES:                                            # (a)
            rows = {}
            for r in list_all(server, "QueryEvents", admin.QueryEventsRequest, "rows",
                              source_id=src, from_block=0):
                if (r.block_number, r.log_index) in rows:
                    violations.add("%s: duplicate row %d:%d" % (src, r.block_number,
                                                                r.log_index))
                rows[(r.block_number, r.log_index)] = r.block_hash.lower()
            applied = applied_of(final_progress[src].checkpoint)
            want = {p: h for p, h in canon.items()
                    if p <= applied and (p[0] >= START or p in rows)}
            if rows != want:
                missing = sorted(set(want) - set(rows))[:5]
                extra = sorted(set(rows) - set(want))[:5]
                wrong = sorted(p for p in set(rows) & set(want) if rows[p] != want[p])[:5]
                violations.add("%s rows != canonical chain: missing %s extra %s wrong hash %s"
                               % (src, missing, extra, wrong))
            events_checked += len(want)

        quarantine_ids = {(k[0], k[2], k[3], k[4].lower()) for k in quarantine}

        def quarantined(src, pos, h):
            return (src, pos[0], pos[1], h) in quarantine_ids

        deliveries_checked = 0
        records = {name: sink.records() for name, sink in sinks.items()}
        for name, recs in records.items():                                  # (b)
            by_pos, keys = {}, set()
            for r in recs:
                if r.idempotency_key in keys:
                    violations.add("%s: two records of key %s" % (name, r.idempotency_key))
                keys.add(r.idempotency_key)
                src, h, li = r.idempotency_key.split("/")
                if src != name or int(li) != r.log_index:
                    violations.add("%s: foreign record %s" % (name, r.idempotency_key))
                by_pos.setdefault((r.block_number, r.log_index), []).append(h.lower())
                deliveries_checked += 1
                figures.bump("sink attempts (all keys)", r.attempts)
            applied = applied_of(final_progress[name].delivery_checkpoint if name == "fin"
                                 else final_progress[name].checkpoint)
            if name == "fin":
                for p, hs in by_pos.items():
                    if p > applied or canon.get(p) not in hs or len(hs) != 1:
                        violations.add("fin: delivery at %s of %s is not the one finalized "
                                       "event (canonical %s, delivered up to %s)" %
                                       (p, hs, canon.get(p), applied))
                want = [p for p in canon if START <= p[0] and p <= applied]
                for p in want:
                    if p not in by_pos:
                        violations.add("fin: finalized event %s never delivered" % (p,))
                events_checked += len(want)
                continue
            orphans = sum(1 for p, hs in by_pos.items() for h in hs if canon.get(p) != h)
            figures.bump("orphaned IMMEDIATE deliveries (allowed before finality)", orphans)
            for p, h in canon.items():
                if p > applied or p[0] < START:
                    continue
                key = "%s/%s/%d" % (name, h, p[1])
                in_sink = h in by_pos.get(p, [])
                is_q = quarantined(name, p, h)
                expect_q = (name == "imm-quar" and p[0] % REJECT_MOD == REJECT_REM) or \
                    (name == "review" and key in review_keys)
                if expect_q and (in_sink or not is_q):
                    violations.add("%s: %s should have a quarantine receipt only (sink %s, "
                                   "quarantine %s)" % (name, p, in_sink, is_q))
                elif not expect_q and (not in_sink or is_q):
                    violations.add("%s: %s should be delivered once (sink %s, quarantine %s)"
                                   % (name, p, in_sink, is_q))
                events_checked += 1

        # (c): everything below the highest applied position ever observed has a receipt.
        for (src, stage), top in poller.max_applied.items():
            if src in ROWS_SOURCES:
                continue  # checked on every rows snapshot
            name = src
            have = {(r.block_number, r.log_index) for r in records[name]}
            have |= {(k[2], k[3]) for k in quarantine if k[0] == src}
            if stage == "ingest" and src == "fin":
                continue  # ingest of a gated source writes the outbox, checked by delivery
            for b in range(START, top[0] + 1):
                for i in range(LOGS):
                    if (b, i) > top:
                        break
                    if (b, i) not in have:
                        violations.add("%s %s: no receipt at %d:%d below observed applied "
                                       "position %s" % (src, stage, b, i, top))
                    figures.bump("receipts checked below observed checkpoints")
        server.stop()
    finally:
        ticker.stop_flag.set()
        poller.stop_flag.set()
        if state.server is not None and state.server.alive():
            state.server.kill()
        for sink in sinks.values():
            sink.stop()
        sim.stop()

    # What the engine saw, from handoffd's JSON logs: faults and reorgs really happened.
    for name in sorted(os.listdir(workdir)):
        if not (name.startswith("handoffd.") and name.endswith(".log")):
            continue
        for line in procs.read_text(os.path.join(workdir, name)).splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                violations.add("%s: a log line is not JSON: %r" % (name, line[:200]))
                continue
            if entry.get("msg") == "provider refused a fetch":
                figures.bump("provider faults seen by handoffd (%s)" % entry.get("code"))
            elif "correction" in entry.get("msg", ""):
                figures.bump("correction pages applied (logged)")
    elapsed = time.monotonic() - t0
    figures.update({
        "seed": seed, "kills survived": kills, "incarnations": state.incarnation,
        "events checked": events_checked, "deliveries checked": deliveries_checked,
        "final head": head, "final finalized": finalized, "seconds": round(elapsed, 1),
        "violations": violations.count()})
    log("torture figures: " + json.dumps(figures, sort_keys=True))
    report = os.environ.get("HANDOFF_TORTURE_REPORT")
    if report:
        with open(report, "a") as f:
            f.write("\n| figure | value |\n| --- | --- |\n")
            for k in sorted(figures):
                f.write("| %s | %s |\n" % (k, figures[k]))
    if violations.count():
        log("FAILED: %d violations" % violations.count())
        return 1
    log("PASSED: %d kills survived, %d events checked, %d deliveries checked, violations: 0"
        % (kills, events_checked, deliveries_checked))
    return 0


if __name__ == "__main__":
    sys.exit(main())

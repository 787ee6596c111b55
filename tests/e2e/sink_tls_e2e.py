#!/usr/bin/python3
"""handoffd delivers to a downstream EventSink over mTLS with a bearer token.

  sink_tls_e2e.py --handoffd=PATH --provider_sim=PATH --sample_sink=PATH --proto_dir=DIR

The real binaries as processes: the provider simulator, the sample sink serving TLS
that requires a client certificate (--tls_client_ca) and a bearer token
(--bearer_token_file), and handoffd with --api_key_env_prefix. Checks that a source
whose spec names the sink's CA, handoffd's client certificate and the token (by its
environment variable) delivers every event; that a missing CA file and a token outside
the policy halt their sources as CONFIG_INVALID, the reason naming the field; that a
client without its certificate retries (BACKING_OFF) instead of delivering; that a token
without TLS is refused as INVALID_ARGUMENT; and that the token is in no reply or log.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import handoffd_e2e as e2e  # noqa: E402  (shared helpers: stubs, certificates, procs)

SINK_TOKEN = "sink-bearer-token-Hunter2-8c1d"
HEAD = 160
START = 100


def main():
    a, work = e2e.procs.setup_sink_test()
    import grpc
    from handoff.v1 import consumer_admin_pb2 as admin, source_pb2 as src
    import sample_sink_admin_pb2_grpc as sink_admin_grpc

    certs = os.path.join(work, "certs")
    os.mkdir(certs)
    e2e.make_certs(certs)  # server.pem (its own root), client-ca.pem, client.pem/.key
    token_file = os.path.join(work, "sink-token")
    with open(token_file, "w") as f:
        f.write(SINK_TOKEN + "\n")

    stops = []
    try:
        sim = e2e.procs.ProviderSim(a.provider_sim, work, [
            "--chain=sim", "--initial_head=%d" % HEAD, "--logs_per_block=2",
            "--finality_lag=5", "--safe_lag=2", "--heartbeat_ms=500"])
        stops.append(sim.stop)
        sink = e2e.procs.SampleSink(a.sample_sink, work, "tls-sink", [
            "--tls_cert=%s/server.pem" % certs, "--tls_key=%s/server.key" % certs,
            "--tls_client_ca=%s/client-ca.pem" % certs, "--bearer_token_file=" + token_file])
        stops.append(sink.stop)
        # The harness's own channel to the sink's admin service: TLS, its certificate.
        sink.channel.close()
        sink.channel = grpc.secure_channel(sink.target, grpc.ssl_channel_credentials(
            root_certificates=e2e.read(certs + "/server.pem"),
            private_key=e2e.read(certs + "/client.key"),
            certificate_chain=e2e.read(certs + "/client.pem")))
        sink.admin = sink_admin_grpc.SampleSinkAdminStub(sink.channel)

        os.environ["HANDOFF_SECRET_SINK"] = SINK_TOKEN  # inherited by handoffd
        os.environ["OTHER_SINK_TOKEN"] = SINK_TOKEN
        server = e2e.procs.Handoffd(a.handoffd, work, "handoffd", os.path.join(work, "data"),
                                    ["--api_key_env_prefix=HANDOFF_SECRET_", "--log_level=debug"])
        stops.append(server.stop)
        replies = []

        def call(method, request):
            reply = server.call(method, request)
            replies.append(reply.SerializeToString())
            return reply

        def spec(source_id, ca=certs + "/server.pem", client_cert=True,
                 token_env="HANDOFF_SECRET_SINK", tls=True):
            s = src.SourceSpec(id=source_id, provider_url=sim.base_url, chain="sim",
                               source="logs", filter="all", transport=src.TRANSPORT_POLL,
                               page_limit=50)
            s.start.block = START
            d = s.sink.downstream
            d.target = sink.target
            d.batch = True
            d.deadline_ms = 20000
            s.sink.gate = src.DELIVERY_GATE_IMMEDIATE
            if tls:
                d.tls.enabled = True
                d.tls.ca_file = ca
                if client_cert:
                    d.tls.client_cert_file = certs + "/client.pem"
                    d.tls.client_key_file = certs + "/client.key"
            if token_env:
                d.token.env = token_env
            return s

        def create(s):
            return call("CreateSource", admin.CreateSourceRequest(spec=s, start=True))

        # 1. mTLS and the token: every event of the chain is delivered, once.
        create(spec("secure"))
        expected = set(sim.canonical(START, HEAD))
        e2e.wait_until("every event delivered over mTLS",
                       lambda: len(sink.records()) >= len(expected), timeout_s=120)
        delivered = {(r.block_number, r.log_index) for r in sink.records()}
        assert delivered == expected, (len(delivered), len(expected))
        e2e.log("ok - %d events delivered over mTLS with a bearer token" % len(expected))

        # 2. What handoffd cannot read or may not use halts the source at its start.
        missing = os.path.join(work, "missing-ca.pem")
        for source_id, s, words in (
                ("missing-ca", spec("missing-ca", ca=missing),
                 ("sink.downstream.tls.ca_file", missing)),
                ("outside-policy", spec("outside-policy", token_env="OTHER_SINK_TOKEN"),
                 ("sink.downstream.token.env", "--api_key_env_prefix"))):
            source = create(s)
            assert source.progress.state == src.SOURCE_STATE_CONFIG_INVALID, source
            for word in words:
                assert word in source.progress.reason, source.progress.reason
        e2e.log("ok - an unreadable CA file and a token outside the policy: CONFIG_INVALID")

        # 3. Without its client certificate the handshake fails: retried, never delivered.
        create(spec("no-client-cert", client_cert=False))

        def backing_off():
            p = call("GetProgress", admin.GetProgressRequest(source_id="no-client-cert"))
            return p if p.state == src.SOURCE_STATE_BACKING_OFF else False
        progress = e2e.wait_until("no-client-cert backing off", backing_off, timeout_s=60)
        e2e.log("ok - without a client certificate: BACKING_OFF (%s)" % progress.reason)

        # 4. A token is never sent in plaintext: refused before anything is stored.
        e2e.expect_code(grpc.StatusCode.INVALID_ARGUMENT, create,
                        spec("plaintext-token", tls=False), contains="plaintext")
        e2e.log("ok - a token without TLS: INVALID_ARGUMENT")

        # 5. The token itself is in no reply and no log.
        call("ListSources", admin.ListSourcesRequest())
        for reply in replies:
            assert SINK_TOKEN.encode() not in reply, reply
        for log_path in (server.log_path, sink.log_path, sim.log_path):
            assert SINK_TOKEN not in e2e.procs.read_text(log_path), log_path
        e2e.log("ok - the token appears in no reply or log")
    finally:
        for stop in reversed(stops):
            try:
                stop()
            except Exception as e:  # noqa: BLE001  (the first failure is the one to see)
                e2e.log("cleanup: %s" % e)
    e2e.log("PASS")


if __name__ == "__main__":
    main()

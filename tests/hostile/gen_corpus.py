#!/usr/bin/env python3
"""Regenerates tests/hostile/corpus/ (hostile provider inputs, also fuzzer seeds).

page_*.json: bodies served by a polling provider (HTTP 200 application/json).
sse_*.txt:   bytes of an SSE stream (HTTP 200 text/event-stream).
Expected outcomes live in hostile_provider_test.cc (kPageCases / kSseCases); every
file here must have an entry there (the test checks). Run: python3 gen_corpus.py
"""
import json, os

H = "0x" + "a" * 64
T = "0x" + "b" * 64
A = "0x" + "c" * 40
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def log(block, idx, **kw):
    d = {"address": A, "topics": [T, T], "data": "0x00ff", "blockNumber": block,
         "blockHash": H, "transactionHash": H, "transactionIndex": "0x3",
         "logIndex": idx, "removed": False}
    d.update(kw)
    for k in [k for k, v in d.items() if v is DEL]:
        del d[k]
    return d


DEL = object()


def page(its, **kw):
    d = {"from": 1200, "through": {"number": 1210, "hash": H}, "next": "c1210",
         "reorg": False, "safe": {"number": 1190, "hash": H}, "finalized": None,
         "tip": 1300, "items": its}
    d.update(kw)
    for k in [k for k, v in d.items() if v is DEL]:
        del d[k]
    return d


def dump(d):
    return json.dumps(d, separators=(",", ":"))


good = [log("0x4b0", "0x0"), log("0x4b1", "0x1f")]
pages = {
    "valid": dump(page(good)),
    "empty_body": "",
    "not_json": "<html>502 Bad Gateway</html>",
    "truncated": dump(page(good))[:150],
    "trailing_garbage": dump(page(good)) + "}}",
    "top_level_array": "[" + dump(page(good)) + "]",
    "from_bool": dump(page(good, **{"from": True})),
    "from_negative": dump(page(good, **{"from": -1})),
    "from_float": dump(page(good, **{"from": 1.5})),
    "from_2pow63": dump(page(good))[:0] + dump(page(good)).replace('"from":1200', '"from":9223372036854775808'),
    "from_huge_string": dump(page(good, **{"from": "99999999999999999999999"})),
    "from_1e400": dump(page(good)).replace('"from":1200', '"from":1e400'),
    "from_hex_string": dump(page(good, **{"from": "0x4b0"})),
    "tip_2pow64": dump(page(good)).replace('"tip":1300', '"tip":18446744073709551616'),
    "through_number_string_garbage": dump(page(good, through={"number": "12a", "hash": H})),
    "through_hash_short": dump(page(good, through={"number": 1210, "hash": "0xab"})),
    "next_number": dump(page(good, next=5)),
    "next_missing": dump(page(good, next=DEL)),
    "items_missing": dump(page(good, items=DEL)),
    "items_object": dump(page({"0": good[0]})),
    "item_not_object": dump(page(["0x4b0"])),
    "reorg_string": dump(page(good, reorg="false")),
    "block_invalid_hex": dump(page([log("0xzz", "0x0")])),
    "block_no_prefix": dump(page([log("4b0", "0x0")])),
    "block_empty_hex": dump(page([log("0x", "0x0")])),
    "block_hex_overflow": dump(page([log("0x10000000000000000", "0x0")])),
    "block_number_type": dump(page([log(1200, "0x0")])),
    "log_index_missing": dump(page([log("0x4b0", DEL)])),
    "address_short": dump(page([log("0x4b0", "0x0", address="0x1234")])),
    "topic_bad_hex": dump(page([log("0x4b0", "0x0", topics=["0x" + "g" * 64])])),
    "topics_too_many": dump(page([log("0x4b0", "0x0", topics=[T] * 5)])),
    "data_odd_length": dump(page([log("0x4b0", "0x0", data="0x0")])),
    "removed_string": dump(page([log("0x4b0", "0x0", removed="no")])),
    "deep_nesting": '{"from":' + "[" * 100000 + "]" * 100000 + "}",
    "invalid_utf8": dump(page(good)).replace('"c1210"', '"c\xff\xfe"'),
    "nul_in_key": dump(page(good)).replace('"next"', '"ne\\u0000xt"'),
    # Parse fine; the engine's PageValidator must refuse them.
    "items_out_of_order": dump(page([log("0x4b1", "0x0"), log("0x4b0", "0x0")])),
    "items_duplicate_position": dump(page([log("0x4b0", "0x1"), log("0x4b0", "0x1")])),
    "item_above_range": dump(page([log("0x4b0", "0x0"), log("0x4bb", "0x0")])),
    "item_below_range": dump(page([log("0x4af", "0x0")])),
    "through_below_from": dump(page([], through={"number": 1100, "hash": H})),
}
sse = {
    "valid": "id: c1210\ndata: " + dump(page(good)) + "\n\n",
    "crlf_and_comments": ":hi\r\nid: c1210\r\ndata: " + dump(page(good)) + "\r\n\r\n",
    "bad_page_json": "id: x\ndata: {\"from\":\n\n",
    "wrong_type_page": "id: x\ndata: " + dump(page(good, next=5)) + "\n\n",
    "error_control_unknown": "event: error\ndata: {\"error\":\"gremlins\"}\n\n",
    "error_control_not_json": "event: error\ndata: \xff\xff\n\n",
    "error_control_resync": "event: error\ndata: {\"error\":\"resync_required\"}\n\n",
    "unknown_event_then_eof": "event: weird\ndata: 1\n\n",
    "retry_huge": "retry: 99999999999999999999999\n\n",
    "incomplete_frame": "id: c1210\ndata: " + dump(page(good))[:40],
    "out_of_order_items": "id: c\ndata: " + dump(page([log("0x4b1", "0x0"), log("0x4b0", "0x0")])) + "\n\n",
}
os.makedirs(out, exist_ok=True)
for name, body in pages.items():
    with open(os.path.join(out, "page_" + name + ".json"), "wb") as f:
        f.write(body.encode("utf-8", "surrogateescape") if "\xff" not in body else body.encode("latin-1"))
for name, body in sse.items():
    with open(os.path.join(out, "sse_" + name + ".txt"), "wb") as f:
        f.write(body.encode("latin-1") if "\xff" in body else body.encode())
print(len(pages), "pages,", len(sse), "streams")

# A gzip bomb: 64 MiB of zeros in ~64 KiB (served with Content-Encoding: gzip).
import gzip
with open(os.path.join(out, "gzip_bomb.gz"), "wb") as f:
    f.write(gzip.compress(b"\0" * (64 << 20), 9))

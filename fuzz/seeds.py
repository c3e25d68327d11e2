#!/usr/bin/env python3
"""Writes small seed corpora for the fuzz targets into fuzz/corpus/<target>/.

The seeds are well-formed inputs in each target's input layout (see
fuzz/README.md and src/fuzzing.rs), so that libFuzzer starts from valid
batches, frames and files instead of having to find their structure first.
Record batches are uncompressed or gzip (the codecs the Python standard
library has); libFuzzer reaches the others from the attributes field.
Deterministic: the same seeds on every run. Usage: python3 fuzz/seeds.py
"""

import gzip
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def crc32c(data):
    """CRC-32C (Castagnoli), bitwise; the seeds are small."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def zigzag(v):
    """Kafka's zigzag varint of a signed value."""
    u = (v << 1) ^ (v >> 63)
    u &= (1 << 64) - 1
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def uvarint(u):
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def record(offset_delta, key, value, headers=()):
    body = bytearray(b"\x00")  # attributes
    body += zigzag(offset_delta)  # timestampDelta
    body += zigzag(offset_delta)  # offsetDelta
    for field in (key, value):
        if field is None:
            body += zigzag(-1)
        else:
            body += zigzag(len(field)) + field
    body += zigzag(len(headers))
    for hk, hv in headers:
        body += zigzag(len(hk)) + hk
        body += zigzag(-1) if hv is None else zigzag(len(hv)) + hv
    return zigzag(len(body)) + bytes(body)


def batch(base_offset, n, codec=0, producer_id=-1, base_sequence=-1, attrs_extra=0):
    """A v2 record batch of `n` records, CRC filled in."""
    records = b"".join(
        record(i, b"k%d" % i, b"value-%d" % i, [(b"h", b"v")] if i % 2 else [])
        for i in range(n)
    )
    if codec == 1:
        records = gzip.compress(records, mtime=0)
    attributes = codec | attrs_extra
    after_crc = struct.pack(
        ">hiqqqhii",
        attributes,
        n - 1,
        1_700_000_000_000,
        1_700_000_000_000 + n - 1,
        producer_id,
        0 if producer_id >= 0 else -1,
        base_sequence,
        n,
    ) + records
    length = 4 + 1 + 4 + len(after_crc)
    head = struct.pack(">qii", base_offset, length, -1) + b"\x02"
    return head + struct.pack(">I", crc32c(after_crc)) + after_crc


def produce_body(version, records):
    flexible = version >= 9
    out = bytearray()

    def string(s, nullable=False):
        if s is None:
            return uvarint(0) if flexible else struct.pack(">h", -1)
        s = s.encode()
        return (uvarint(len(s) + 1) if flexible else struct.pack(">h", len(s))) + s

    def array_len(n):
        return uvarint(n + 1) if flexible else struct.pack(">i", n)

    out += string("tx" if version % 2 else None)
    out += struct.pack(">hi", -1, 30000)
    out += array_len(1)
    out += string("topic")
    out += array_len(1)
    out += struct.pack(">i", 0)
    out += (uvarint(len(records) + 1) if flexible else struct.pack(">i", len(records))) + records
    if flexible:
        out += b"\x00\x00\x00"  # partition, topic, request tagged fields
    return bytes(out)


def request_header(api_key, version, flexible):
    out = struct.pack(">hhi", api_key, version, 7) + struct.pack(">h", 6) + b"client"
    if flexible:
        out += b"\x00"
    return out


def write(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    plain = batch(0, 3)
    gz = batch(0, 2, codec=1)
    idem = batch(0, 2, producer_id=5, base_sequence=0)
    txn = batch(0, 2, producer_id=6, base_sequence=0, attrs_extra=0x10)

    # produce_decode: version byte, flags byte, then records or a body.
    for i, b in enumerate([plain, gz, idem, txn]):
        write("produce_decode", "records-%d" % i, bytes([4, 0]) + b)
    for v in (3, 8, 9, 12):
        write("produce_decode", "request-v%d" % v, bytes([v - 3, 2]) + produce_body(v, plain))

    # request_frame: flags byte (bit 0: length prefix), then the frame.
    frames = [
        request_header(0, 8, False) + produce_body(8, plain),
        request_header(0, 9, True) + produce_body(9, gz),
        request_header(18, 3, True) + b"\x06fjord\x060.1.0\x00",
        request_header(18, 0, False),
        request_header(3, 12, True) + b"\x01\x01\x00\x00",  # Metadata v12: null topics
        request_header(3, 1, False) + struct.pack(">i", 1) + struct.pack(">h", 1) + b"t",
        request_header(10, 4, True) + b"\x02g\x00\x00",  # FindCoordinator v4
        request_header(12, 4, True) + b"\x02g" + struct.pack(">i", 1) + b"\x02m\x00\x00",
        # The hand-coded versions (src/protocol/hand_versions.rs), bodies as
        # Kafka 4.4's kafka-clients serializes them (the unit tests' bytes).
        request_header(8, 10, True) + bytes.fromhex(
            "026700000003026d00020102030405060708090a0b0c0d0e0f10"
            "0200000001000000000000002a00000005036d64000000"),  # OffsetCommit v10
        request_header(9, 10, True) + bytes.fromhex(
            "030267026d00000004020102030405060708090a0b0c0d0e0f10"
            "0300000000000000010000026800ffffffff00000100"),  # OffsetFetch v10
        request_header(27, 2, True) + bytes.fromhex(
            "0200000000000000070001010202740300000000000000020000000003020000"),
        request_header(35, 5, True) + bytes.fromhex("02027402000000000000"),
        # src/protocol/hand_versions_more.rs: ListOffsets v11, ApiVersions
        # v5, TxnOffsetCommit v6, DeleteGroups v3.
        request_header(2, 11, True) + bytes.fromhex(
            "ffffffff01020274020000000000000003fffffffffffffffa00000000138800"),
        request_header(18, 5, True) + bytes.fromhex(
            "126170616368652d6b61666b612d6a61766106342e342e3004616263000003e900"),
        request_header(28, 6, True) + bytes.fromhex(
            "027802670000000000000007000100000003026d00020102030405060708090a0b0c0d0e0f10"
            "0200000001000000000000002a00000005036d64000000"),
        request_header(42, 3, True) + bytes.fromhex("030267026800"),
        # Produce v13 (topic ids), as kafka-clients 4.4 serializes it.
        request_header(0, 13, True) + bytes.fromhex(
            "00ffff000003e8020102030405060708090a0b0c0d0e0f10020000000004010203000000"),
    ]
    for i, f in enumerate(frames):
        write("request_frame", "frame-%d" % i, b"\x00" + f)
        write("request_frame", "prefixed-%d" % i, b"\x01" + struct.pack(">i", len(f)) + f)

    # segment_recovery: flags, base offset, min base offset (u64 LE each), file.
    seg = batch(0, 3) + batch(3, 2, codec=1) + batch(5, 1, producer_id=9, base_sequence=0)
    for flags in (0x00, 0x02, 0x13, 0x21, 0x31):
        write(
            "segment_recovery",
            "segment-%02x" % flags,
            bytes([flags]) + struct.pack("<QQ", 0, 0) + seg + b"\x00" * 64,
        )
    write("segment_recovery", "torn", b"\x00" + struct.pack("<QQ", 0, 0) + seg[:-5])

    # index_files: log size (u64 LE), .index length (u16 LE), .index, .timeindex.
    index = struct.pack(">ii", 3, 0) + struct.pack(">ii", 9, 4096) + b"\x00" * 8
    tindex = struct.pack(">qi", 1_700_000_000_000, 3) + struct.pack(">qi", 1_700_000_000_100, 9)
    write("index_files", "pair", struct.pack("<QH", 1 << 20, len(index)) + index + tindex)
    txn_entry = struct.pack(">hqqqq", 0, 7, 10, 20, 10)
    write("index_files", "txnindex", struct.pack("<QH", 0, 0) + txn_entry * 2)

    # checkpoint: the text of a checkpoint file.
    write("checkpoint", "two", b"0\n2\norders 0 42\nlogs-x 3 0\n")
    write("checkpoint", "empty", b"0\n0\n")

    # metadata_log: flags byte (bit 0: add CRCs), then lines.
    recs = [
        {"type": "CreateTopic", "name": "t", "id": list(range(16)), "shards": [0, 1],
         "configs": {"cleanup.policy": "delete"}},
        {"type": "AddPartitions", "name": "t", "shards": [2]},
        {"type": "SetTopicConfigs", "name": "t", "configs": {}},
        {"type": "ProducerIdBlock", "next": 1000},
        {"type": "DeleteTopic", "name": "t"},
    ]
    lines = [json.dumps(r, separators=(",", ":")).encode() for r in recs]
    write("metadata_log", "lines", b"\x01" + b"\n".join(lines) + b"\n")
    with_crc = b"".join(b"%08x %s\n" % (crc32c(l), l) for l in lines)
    write("metadata_log", "file", b"\x00" + with_crc)

    # producer_snapshot: flags byte; no valid archive seed (rkyv layout), the
    # fuzzer starts from the header.
    write("producer_snapshot", "header", b"\x00FJPS\x02\x00\x00\x00" + b"\x00" * 8)
    write("producer_snapshot", "wrapped", b"\x01" + b"\x00" * 32)

    # group_records / txn_records: key length (u16 LE), key, value.
    def kv(key, value):
        return struct.pack("<H", len(key)) + key + value

    def s16(s):
        return struct.pack(">h", len(s)) + s

    offset_key = struct.pack(">h", 1) + s16(b"group") + s16(b"topic") + struct.pack(">i", 0)
    offset_value = struct.pack(">hqi", 3, 42, 0) + s16(b"meta") + struct.pack(">q", 1)
    group_key = struct.pack(">h", 2) + s16(b"group")
    group_value = (
        struct.pack(">h", 3) + s16(b"consumer") + struct.pack(">i", 1) + s16(b"range")
        + s16(b"m1") + struct.pack(">q", 5) + struct.pack(">i", 1) + s16(b"m1")
        + struct.pack(">h", -1) + s16(b"c") + s16(b"/127.0.0.1") + struct.pack(">ii", 300000, 45000)
        + struct.pack(">i", 2) + b"\x00\x01" + struct.pack(">i", 0)
    )
    write("group_records", "offset", kv(offset_key, offset_value))
    write("group_records", "group", kv(group_key, group_value))

    txn_key = struct.pack(">h", 0) + s16(b"tx-1")
    txn_value = (
        struct.pack(">hqhib", 1, 7, 0, 60000, 1)
        + uvarint(2) + uvarint(2) + b"t" + uvarint(2) + struct.pack(">i", 0) + b"\x00"
        + struct.pack(">qq", 1, 1)
        + uvarint(1) + uvarint(2) + uvarint(2) + struct.pack(">h", 2)
    )
    write("txn_records", "ongoing", kv(txn_key, txn_value))
    empty_value = struct.pack(">hqhib", 1, 7, 0, 60000, 0) + b"\x00" + struct.pack(">qq", 1, 1) + b"\x00"
    write("txn_records", "empty", kv(txn_key, empty_value))
    return 0


if __name__ == "__main__":
    sys.exit(main())

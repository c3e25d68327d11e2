#!/usr/bin/env python3
"""Broker-side request latency, read off the wire.

usage: scripts/wire-latency.py CAPTURE.pcap PORT [SLOW_MS]

CAPTURE is a full-size capture of the broker's port on the loopback
interface (`tcpdump -i lo -s 0 -w CAPTURE port PORT`; write it to tmpfs, a
capture written to the broker's disk disturbs what it measures). Each
connection's two byte streams are cut into Kafka frames; a request is
matched with the response that carries its correlation id, and the time
from the packet that completes the request to the packet that completes the
response is the broker's latency for it, loopback included and every client
delay excluded. Prints, per API key, the count and p50/p99/p99.9/max in ms.
With SLOW_MS, also lists the episodes of Produce requests slower than that
(requests sent less than 50 ms apart form one episode), so periodic stalls
show up with their times.

A capture that starts in the middle of a connection is picked up at the
first packet that begins with a plausible frame header; frames before it
are skipped.
"""
import collections
import struct
import sys

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
LINKTYPE_ETHERNET = 1
LINKTYPE_LINUX_SLL = 113
FRAME_MAX_BYTES = 1 << 26


def packets(path):
    """Yields (timestamp, source port, destination port, TCP payload)."""
    with open(path, "rb") as f:
        header = f.read(24)
        magic = struct.unpack("<I", header[:4])[0]
        if magic not in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
            sys.exit(f"{path}: not a little-endian pcap file")
        divisor = 1e9 if magic == PCAP_MAGIC_NS else 1e6
        link = struct.unpack("<I", header[20:24])[0]
        link_bytes = {LINKTYPE_ETHERNET: 14, LINKTYPE_LINUX_SLL: 16}.get(link)
        if link_bytes is None:
            sys.exit(f"{path}: link type {link} is not supported")
        while True:
            record = f.read(16)
            if len(record) < 16:
                return
            secs, frac, captured, _ = struct.unpack("<IIII", record)
            data = f.read(captured)
            ip = data[link_bytes:]
            if len(ip) < 20 or ip[0] >> 4 != 4:
                continue
            ip_header = (ip[0] & 15) * 4
            tcp = ip[ip_header:]
            if len(tcp) < 20:
                continue
            sport, dport = struct.unpack(">HH", tcp[:4])
            payload = tcp[(tcp[12] >> 4) * 4 :]
            if payload:
                yield secs + frac / divisor, sport, dport, payload


def plausible(is_request, data):
    if len(data) < 12:
        return False
    size, api_key, version = struct.unpack(">ihh", data[:8])
    if not 0 < size < FRAME_MAX_BYTES:
        return False
    return not is_request or (0 <= api_key < 100 and 0 <= version < 30)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    path, port = sys.argv[1], int(sys.argv[2])
    slow_ms = float(sys.argv[3]) if len(sys.argv) == 4 else None
    produces = []  # (sent at, latency ms)
    streams = {}  # (client port, is_request) -> bytearray, once in sync
    sent = collections.defaultdict(dict)  # client port -> correlation id -> (t, api)
    latencies = collections.defaultdict(list)
    for ts, sport, dport, payload in packets(path):
        if dport == port:
            key = (sport, True)
        elif sport == port:
            key = (dport, False)
        else:
            continue
        if key not in streams:
            if not plausible(key[1], payload):
                continue
            streams[key] = bytearray()
        buf = streams[key]
        buf.extend(payload)
        while len(buf) >= 4:
            size = struct.unpack(">i", buf[:4])[0]
            if len(buf) < 4 + size:
                break
            frame = bytes(buf[4 : 4 + size])
            del buf[: 4 + size]
            if key[1] and len(frame) >= 8:
                api_key, _, correlation = struct.unpack(">hhi", frame[:8])
                sent[key[0]][correlation] = (ts, api_key)
            elif not key[1] and len(frame) >= 4:
                correlation = struct.unpack(">i", frame[:4])[0]
                request = sent[key[0]].pop(correlation, None)
                if request:
                    latencies[request[1]].append((ts - request[0]) * 1000)
                    if request[1] == 0:
                        produces.append((request[0], (ts - request[0]) * 1000))
    for api_key, values in sorted(latencies.items()):
        values.sort()
        n = len(values)

        def q(p):
            return values[min(n - 1, int(p * n))]

        print(
            f"api {api_key}: n={n} p50 {q(0.5):.3f} p99 {q(0.99):.3f} "
            f"p99.9 {q(0.999):.3f} max {values[-1]:.3f} ms"
        )
    if slow_ms is not None and produces:
        print_slow_episodes(produces, slow_ms)


def print_slow_episodes(produces, slow_ms):
    t0 = produces[0][0]
    episodes = []  # [first sent, last sent, max latency, count]
    for sent_at, ms in produces:
        if ms <= slow_ms:
            continue
        t = sent_at - t0
        if episodes and t - episodes[-1][1] < 0.05:
            e = episodes[-1]
            e[1], e[2], e[3] = t, max(e[2], ms), e[3] + 1
        else:
            episodes.append([t, t, ms, 1])
    print(
        f"Produce requests slower than {slow_ms} ms: {len(episodes)} episodes "
        f"(t=0 is {t0:.6f}, seconds since the epoch on the capture's clock)"
    )
    for first, last, worst, n in episodes:
        print(f"  t={first:8.3f}..{last:8.3f} s  {n} requests, max {worst:.1f} ms")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Measures the unfinished-chunked flood: holds N unfinished chunked requests open against a server on 127.0.0.1
(sent without a token), while another client GETs /v1/orders with a token;
prints how many of the N connections the server still holds after each
second (a connection the kernel's full accept queue dropped is never
answered, and counted apart), and the other client's latencies.

    scripts/chunked-flood.py HOST PORT N SECONDS TOKEN   (ulimit -n above N)
"""
import socket, statistics, sys, time, threading

host, port, n, seconds, token = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
HEAD = (b"POST /v1/orders HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n10001\r\nab")

latencies, timeouts = [], 0
stop = False
def other():
    global timeouts
    req = (f"GET /v1/orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
           "Connection: close\r\n\r\n").encode()
    while not stop:
        started = time.monotonic()
        try:
            c = socket.create_connection((host, port), timeout=10)
            c.settimeout(10)
            c.sendall(req)
            data = b""
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                data += chunk
            c.close()
            if data.startswith(b"HTTP/1.1 200"):
                latencies.append(time.monotonic() - started)
            else:
                timeouts += 1
        except OSError:
            timeouts += 1
        time.sleep(0.2)
th = threading.Thread(target=other); th.start()

socks, failed = [], 0
t0 = time.monotonic()
for _ in range(n):
    if time.monotonic() - t0 > 60:
        break
    s = socket.socket()
    s.settimeout(1)
    try:
        s.connect((host, port))
        s.sendall(HEAD)
        s.setblocking(False)
        socks.append(s)
    except OSError:
        failed += 1
        s.close()
print(f"opened {len(socks)} (failed {failed}) in {time.monotonic()-t0:.1f} s", flush=True)


open_ = set(range(len(socks)))
answered = set()
received = {}
start = time.monotonic()
next_report = 1.0
while time.monotonic() - start < seconds:
    for i in list(open_):
        s = socks[i]
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    open_.discard(i); s.close(); break
                answered.add(i)
                received[i] = received.get(i, b"") + d
        except BlockingIOError:
            pass
        except OSError:
            open_.discard(i); s.close()
    el = time.monotonic() - start
    if el >= next_report:
        print(f"t={el:4.1f}s held={len(open_ & answered)} (open, never answered: {len(open_ - answered)})", flush=True)
        next_report += 1.0 if next_report < 10 else 5.0
    time.sleep(0.05)
stop = True; th.join()
for i in sorted(open_ & answered)[:3]:
    print("held", i, received.get(i, b"")[:400], flush=True)
for i in open_:
    socks[i].close()
if latencies:
    print(f"other client: {len(latencies)} answered, median {statistics.median(latencies)*1000:.1f} ms, "
          f"max {max(latencies)*1000:.1f} ms, failed/timed out {timeouts}")
else:
    print(f"other client: none answered, failed/timed out {timeouts}")

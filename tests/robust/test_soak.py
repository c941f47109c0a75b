"""Soak: ``arbormem serve`` in its own process under concurrent loopback clients for a bounded
time. Reports throughput, p50/p99 latency, errors and the server's RSS over time; asserts no
error, no answer carrying another user's data, and a flat memory footprint.

``ARBORMEM_SOAK_SECONDS`` (default 20) and ``ARBORMEM_SOAK_CLIENTS`` (default 6) size it;
``pytest -s`` prints the figures.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _client(port: int, user: str, stop: float, lat: list[float], errors: list[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    i = 0
    while time.monotonic() < stop:
        i += 1
        kind = i % 4
        if kind in (0, 1):
            path, body = f"/v1/users/{user}/exchanges", {"messages": [
                {"role": "user", "content": f"{user}mark note {i} about gardening and {i % 7}"},
                {"role": "assistant", "content": f"noted {i}"}]}
        elif kind == 2:
            path, body = f"/v1/users/{user}/recall", {"query": "gardening note", "max_tokens": 400}
        else:
            path, body = f"/v1/users/{user}/search", {"query": "gardening", "limit": 5}
        t0 = time.perf_counter()
        try:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{path}: {exc!r}")
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            continue
        lat.append(time.perf_counter() - t0)
        if resp.status >= 300:
            errors.append(f"{path}: {resp.status} {data[:200]!r}")
        elif kind >= 2 and b"mark note" in data and data.count(b"mark note") != data.count(f"{user}mark note".encode()):
            errors.append(f"{path}: another user's data in the answer")
    conn.close()


@pytest.mark.slow
def test_http_soak(tmp_path: Path) -> None:
    seconds = float(os.environ.get("ARBORMEM_SOAK_SECONDS", "20"))
    clients = int(os.environ.get("ARBORMEM_SOAK_CLIENTS", "6"))
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "arbormem.cli", "serve", "--db", str(tmp_path / "soak.db"),
         "--embedder", "hash", "--no-auth", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
                time.sleep(0.1)
        lat: list[float] = []
        errors: list[str] = []
        start = time.monotonic()
        stop = start + seconds
        threads = [threading.Thread(target=_client, args=(port, f"user{c}", stop, lat, errors))
                   for c in range(clients)]
        for t in threads:
            t.start()
        rss: list[float] = []
        while time.monotonic() < stop:
            rss.append(_rss_mb(server.pid))
            time.sleep(1.0)
        for t in threads:
            t.join(timeout=60)
        elapsed = time.monotonic() - start
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stderr is not None:
            server.stderr.close()
    lat.sort()
    p50 = lat[len(lat) // 2]
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"soak: {clients} clients, {elapsed:.0f}s, {len(lat)} requests, {len(lat) / elapsed:.0f} req/s, "
          f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, errors {len(errors)}, "
          f"RSS MB {[round(x) for x in rss]}")
    assert errors == [], errors[:5]
    assert len(lat) > clients * 10
    # Flat memory: after the first quarter (imports, caches warming) RSS may drift only a little.
    warm = statistics.median(rss[len(rss) // 4: len(rss) // 2 + 1])
    assert rss[-1] <= warm * 1.3 + 20, rss

#!/usr/bin/env python3
"""Records the wire traffic between a real client and a real server, for fixtures.

    record_wire.py --listen 8100 --upstream http://127.0.0.1:8011 --out traffic.jsonl

A reverse proxy on loopback: every request is forwarded to the upstream as it came (method, path,
headers but Host and hop-by-hop ones, body), the answer is relayed to the client as it arrives
(server-sent events chunk by chunk), and one JSON line per exchange is appended to --out:

    {"request": {"method", "path", "headers", "body"},
     "response": {"status", "headers", "body"} | {"status", "headers", "events": [data, ...]}}

`body` is the parsed JSON when the body is JSON, else the text. Nothing is changed on the way, so
what is recorded is what each side really sent. Standard library only.
"""

import argparse
import http.client
import json
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host",
       "content-length"}
LOCK = threading.Lock()


def parse_body(raw: bytes):
    if not raw:
        return None
    text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def make_handler(upstream: urllib.parse.SplitResult, out_path: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _relay(self):
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            conn = http.client.HTTPConnection(upstream.hostname, upstream.port or 80, timeout=600)
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            resp_headers = {k: v for k, v in resp.getheaders() if k.lower() not in HOP}
            record = {
                "request": {"method": self.command, "path": self.path, "headers": dict(self.headers.items()),
                            "body": parse_body(body)},
                "response": {"status": resp.status, "headers": resp_headers},
            }
            self.send_response(resp.status)
            for k, v in resp_headers.items():
                self.send_header(k, v)
            if "text/event-stream" in resp.getheader("content-type", ""):
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                events, buf = [], b""
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        break
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                    buf += chunk
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        data = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
                        if data:
                            events.append(parse_body(b"\n".join(data)) if data != [b"[DONE]"] else "[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                record["response"]["events"] = events
            else:
                data = resp.read()
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                record["response"]["body"] = parse_body(data)
            conn.close()
            with LOCK, open(out_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")

        do_GET = do_POST = do_PUT = do_DELETE = _relay

    return Handler


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", type=int, required=True)
    p.add_argument("--upstream", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", a.listen), make_handler(urllib.parse.urlsplit(a.upstream), a.out))
    print(f"recording 127.0.0.1:{a.listen} -> {a.upstream} into {a.out}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

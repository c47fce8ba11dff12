#!/usr/bin/env python3
"""An S3-compatible server on loopback for Stagehand's object-store tests.

Starts moto's server with real request authentication (SigV4 signatures are checked against an
IAM access key made here), creates the buckets asked for, and, with --proxy, a TCP proxy in front
of it that the test can take down and bring back to play a server that stops mid-upload.

Prints one JSON line: {"endpoint", "proxy_endpoint", "access_key", "secret_key", "region"}.
Then reads commands on stdin, one per line, and answers each with one line:
  down               the proxy drops every connection and refuses new ones
  up                 the proxy accepts again
  down_after N       the proxy goes down once N more request bytes have passed through it
  uploads BUCKET     JSON list of open multipart uploads in BUCKET (straight to the server)
  stats              JSON {"sent", "received"}: bytes the proxy passed to and from the server
  reset_stats        zeroes those counters
EOF is the end: the server stops.
"""
import argparse
import json
import os
import socket
import sys
import threading


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proxy:
    """Forwards 127.0.0.1:port to the server; can be taken down and brought back on the same port."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.port = free_port()
        self.lock = threading.Lock()
        self.listener = None
        self.conns = set()
        self.budget = None  # bytes left before going down; None: unlimited
        self.sent = 0
        self.received = 0
        self.up()

    def up(self):
        with self.lock:
            if self.listener is not None:
                return
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.port))
            s.listen(64)
            self.listener = s
            self.budget = None
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def down(self):
        with self.lock:
            listener, self.listener = self.listener, None
            conns, self.conns = self.conns, set()
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def down_after(self, n):
        with self.lock:
            self.budget = n

    def _accept(self, listener):
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.listener is not listener:
                    client.close()
                    server.close()
                    return
                self.conns.update((client, server))
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src, dst, counts):
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                with self.lock:
                    if counts:
                        self.sent += len(data)
                    else:
                        self.received += len(data)
                if counts:
                    trip = False
                    with self.lock:
                        if self.budget is not None:
                            self.budget -= len(data)
                            trip = self.budget <= 0
                    if trip:
                        self.down()
                        return
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def verify_signatures_like_s3():
    """Makes moto canonicalize a signed request's query string as S3 does.

    S3 decodes each query parameter and URI-encodes it again (only A-Z a-z 0-9 - _ . ~ stay as they
    are) before checking the signature. moto's server sees the query already percent-decoded and
    signs it as it is, so a correctly signed `prefix=a%2Fb` fails there while a wrongly signed
    `prefix=a/b` passes. With this, both behave as on S3.
    """
    from urllib.parse import quote, unquote
    from moto.iam import access_control

    original = access_control.S3IAMRequest._create_aws_request

    def create_aws_request(self):
        path, sep, query = self._path.partition("?")
        if sep:
            pairs = []
            for pair in query.split("&"):
                k, _, v = pair.partition("=")
                pairs.append(quote(unquote(k), safe="-_.~") + "=" + quote(unquote(v), safe="-_.~"))
            self._path = path + "?" + "&".join(pairs)
        return original(self)

    access_control.S3IAMRequest._create_aws_request = create_aws_request


# Uploads per ListMultipartUploads answer; S3 answers at most 1000. The "uploads_page N" command
# lowers it so that a test can see a client follow the markers without making 1000 uploads.
UPLOADS_PAGE = [1000]


def page_multipart_uploads_like_s3():
    """Makes moto page ListMultipartUploads as S3 does.

    moto answers every open upload at once and ignores key-marker and upload-id-marker. S3 sorts
    uploads by key, then by upload id, answers at most max-uploads (1000) of them after the markers,
    and says IsTruncated with NextKeyMarker and NextUploadIdMarker when more follow.
    """
    from moto.core.responses import ActionResult
    from moto.s3.responses import S3Response

    def list_multipart_uploads(self):
        query = self.querystring
        prefix = query.get("prefix", [""])[0] or ""
        key_marker = query.get("key-marker", [""])[0] or ""
        id_marker = query.get("upload-id-marker", [""])[0] or ""
        page = min(int(query.get("max-uploads", [1000])[0]), UPLOADS_PAGE[0])
        uploads = sorted((u for u in self.backend.list_multipart_uploads(self.bucket_name).values()
                          if u.key_name.startswith(prefix)), key=lambda u: (u.key_name, u.id))
        if key_marker:
            uploads = [u for u in uploads if (u.key_name, u.id) > (key_marker, id_marker)]
        shown, more = uploads[:page], len(uploads) > page
        result = {"Bucket": self.bucket_name, "KeyMarker": key_marker, "UploadIdMarker": id_marker,
                  "MaxUploads": page, "IsTruncated": more,
                  "Uploads": [{"Key": u.key_name, "UploadId": u.id, "StorageClass": "STANDARD",
                               "Initiated": "2010-11-10T20:48:33.000Z"} for u in shown]}
        if more:
            result["NextKeyMarker"] = shown[-1].key_name
            result["NextUploadIdMarker"] = shown[-1].id
        self.data["Action"] = "ListMultipartUploads"
        return self.serialized(ActionResult(result))

    S3Response.list_multipart_uploads = list_multipart_uploads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bucket", action="append", default=[])
    ap.add_argument("--proxy", action="store_true")
    ap.add_argument("--region", default="us-east-1")
    args = ap.parse_args()

    # Authentication starts after the three IAM calls below that make the test's access key.
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bootstrap")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bootstrap")
    import boto3
    from moto.server import ThreadedMotoServer

    verify_signatures_like_s3()
    page_multipart_uploads_like_s3()

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=args.region)
    iam.create_user(UserName="stagehand")
    iam.put_user_policy(UserName="stagehand", PolicyName="all",
                        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [
                            {"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="stagehand")["AccessKey"]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name=args.region,
                      aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    for b in args.bucket:
        s3.create_bucket(Bucket=b)
    proxy = Proxy(port) if args.proxy else None
    print(json.dumps({"endpoint": endpoint,
                      "proxy_endpoint": f"http://127.0.0.1:{proxy.port}" if proxy else "",
                      "access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"],
                      "region": args.region}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "down" and proxy:
            proxy.down()
            print("ok", flush=True)
        elif cmd[0] == "up" and proxy:
            proxy.up()
            print("ok", flush=True)
        elif cmd[0] == "down_after" and proxy and len(cmd) == 2:
            proxy.down_after(int(cmd[1]))
            print("ok", flush=True)
        elif cmd[0] == "uploads" and len(cmd) == 2:
            r = s3.list_multipart_uploads(Bucket=cmd[1])
            print(json.dumps([{"key": u["Key"], "upload_id": u["UploadId"]} for u in r.get("Uploads", [])]),
                  flush=True)
        elif cmd[0] == "uploads_page" and len(cmd) == 2:
            UPLOADS_PAGE[0] = int(cmd[1])
            print("ok", flush=True)
        elif cmd[0] == "open_upload" and len(cmd) == 3:
            s3.create_multipart_upload(Bucket=cmd[1], Key=cmd[2])
            print("ok", flush=True)
        elif cmd[0] == "stats" and proxy:
            with proxy.lock:
                print(json.dumps({"sent": proxy.sent, "received": proxy.received}), flush=True)
        elif cmd[0] == "reset_stats" and proxy:
            with proxy.lock:
                proxy.sent = proxy.received = 0
            print("ok", flush=True)
        else:
            print("error unknown command " + line.strip(), flush=True)
    if proxy:
        proxy.down()
    server.stop()


if __name__ == "__main__":
    main()

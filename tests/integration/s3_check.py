#!/usr/bin/env python3
"""Independent check of a Stagehand checkpoint in an S3-compatible store, with boto3.

Reads the tracker and the metadata of the step it names, and checks that every data file the
metadata lists exists as an object of exactly its size, that trainer_state.json exists, and that
no multipart upload is left open below the prefix. With --compare-local DIR, every data object
must equal DIR/global_step_<N>/policy/<file> byte for byte.

Credentials and endpoint: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, AWS_REGION.
Prints one JSON line: {"step", "files", "bytes", "multipart": [files uploaded in parts], "problems"};
exits 1 when there are problems.
"""
import argparse
import json
import os
import sys

import boto3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url", help="s3://bucket/prefix (a ckpt_path)")
    ap.add_argument("--compare-local")
    args = ap.parse_args()
    assert args.url.startswith("s3://")
    bucket, _, prefix = args.url[5:].partition("/")
    prefix = prefix.strip("/")
    base = prefix + "/" if prefix else ""
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"],
                      region_name=os.environ.get("AWS_REGION", "us-east-1"))
    problems = []
    step = int(s3.get_object(Bucket=bucket, Key=base + "latest_ckpt_global_step.txt")["Body"].read().decode().strip())
    step_key = f"{base}global_step_{step}"
    metadata = json.loads(s3.get_object(Bucket=bucket, Key=step_key + "/policy/metadata.json")["Body"].read())
    if metadata.get("step") != step:
        problems.append(f"metadata step {metadata.get('step')} != tracker step {step}")
    try:
        s3.head_object(Bucket=bucket, Key=step_key + "/trainer_state.json")
    except Exception as e:  # noqa: BLE001 - any failure is a problem to report
        problems.append(f"trainer_state.json: {e}")
    multipart = []
    total = 0
    for name, f in sorted(metadata["files"].items()):
        key = f"{step_key}/policy/{name}"
        try:
            head = s3.head_object(Bucket=bucket, Key=key)
        except Exception as e:  # noqa: BLE001
            problems.append(f"{key}: {e}")
            continue
        if head["ContentLength"] != f["size"]:
            problems.append(f"{key}: {head['ContentLength']} bytes, metadata says {f['size']}")
        total += head["ContentLength"]
        if "-" in head["ETag"]:
            multipart.append(name)
        if args.compare_local:
            local = os.path.join(args.compare_local, f"global_step_{step}", "policy", name)
            with open(local, "rb") as fh:
                if fh.read() != s3.get_object(Bucket=bucket, Key=key)["Body"].read():
                    problems.append(f"{key} differs from {local}")
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=step_key + "/policy/")
    data_objects = [o["Key"] for o in listed.get("Contents", []) if o["Key"].endswith(".safetensors")]
    if len(data_objects) != len(metadata["files"]):
        problems.append(f"{len(data_objects)} data objects, metadata lists {len(metadata['files'])}")
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix=base).get("Uploads", [])
    if uploads:
        problems.append(f"{len(uploads)} multipart uploads left open")
    print(json.dumps({"step": step, "files": len(metadata["files"]), "bytes": total, "multipart": multipart,
                      "problems": problems}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

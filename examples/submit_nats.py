#!/usr/bin/env python3
"""Submit an Allot workload from CI without the `allot` binary: publish the raw CloudEvent.

    pip install nats-py pyyaml
    python3 examples/submit_nats.py examples/train-eval.yaml --run-id "$CI_PIPELINE_ID" \
        --credentials .allot/auth/team-vision.credentials.json

The bus lets in only its users: `allot up --teams FILE` writes one credentials file per team
(`.allot/auth/team-<team>.credentials.json`: user, password, URL), whose user may publish only
its team's submissions and aborts. Submitting under another team is refused by the server (no
PubAck: this script then fails). `--nats URL` overrides the file's URL; a server without users
needs no credentials.

What it sends (see examples/README.md):
  subject   allot.workload.submitted.<team>
  headers   Nats-Msg-Id: SHA-256 of the team, the idempotency key and the spec   (JetStream
            keeps one copy per id within the WORKLOADS stream's duplicate window, one hour)
  payload   a CloudEvents 1.0 structured-JSON event of type io.allot.workload.v1.submitted

It does not validate the spec: run `allot validate FILE` where the binary is available. The
idempotency key is SHA-256 over the spec (as canonical JSON) and the run id, so a retried CI job
with the same spec and run id publishes the same key and is stored once. It is computed from
this script's canonical JSON, which is not byte-for-byte `allot submit`'s: use one of the two
submission paths per pipeline. The workload id is `<name>-<first 10 hex digits of
SHA-256(<team>\n<key>)>`: the planner derives it again and refuses a submission whose id
does not follow (so nobody can take the id of another team's submission), or whose id is known
with a different spec (a key reused for other content).
"""

import argparse
import asyncio
import datetime
import getpass
import hashlib
import json
import socket
import sys
import uuid

import nats
import yaml

# The namespace of CloudEvent ids derived from idempotency keys (allot_workload::submit).
EVENT_ID_NAMESPACE = uuid.UUID("6a1f9c2e-4b7d-4e21-9a83-5d0c7e14b2f6")


def canonical_json(spec: dict) -> str:
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def idempotency_key(spec: dict, run_id: str) -> str:
    digest = hashlib.sha256()
    digest.update(b"allot/v1 workload\n")
    digest.update(canonical_json(spec).encode())
    digest.update(b"\n")
    digest.update(run_id.encode())
    return digest.hexdigest()


def workload_id(spec: dict, key: str) -> str:
    # From the team and the key: the planner derives it again and refuses an id that differs.
    team_key = f"{spec['metadata']['team']}\n{key}"
    return f"{spec['metadata']['name']}-{hashlib.sha256(team_key.encode()).hexdigest()[:10]}"


def msg_id(spec: dict, key: str) -> str:
    # Nats-Msg-Id: a hash of the team, the key and the spec. A retry is stored once; another
    # team's equal key, or this key reused for another spec, is another message (which the
    # planner then refuses out loud rather than JetStream dropping it as a duplicate).
    digest = hashlib.sha256()
    digest.update(b"allot/v1 submission\n")
    digest.update(spec["metadata"]["team"].encode())
    digest.update(b"\n")
    digest.update(key.encode())
    digest.update(b"\n")
    digest.update(canonical_json(spec).encode())
    return digest.hexdigest()


def cloud_event(spec: dict, key: str, run_id: str, submitter: str) -> dict:
    wid = workload_id(spec, key)
    data = {"workload_id": wid, "idempotency_key": key, "submitter": submitter, "spec": spec}
    if run_id:
        data["run_id"] = run_id
    return {
        "specversion": "1.0",
        # The same team, key and spec give the same id: a re-sent event is the same event.
        "id": str(uuid.uuid5(EVENT_ID_NAMESPACE, msg_id(spec, key))),
        "source": "/ci/submit_nats.py",
        "type": "io.allot.workload.v1.submitted",
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z"),
        "subject": wid,
        "datacontenttype": "application/json",
        "team": spec["metadata"]["team"],
        "data": data,
    }


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="workload spec, YAML or JSON")
    parser.add_argument("--run-id", default="", help="the CI run submitting it")
    parser.add_argument("--credentials", help="a team's credentials file (user, password, url)")
    parser.add_argument("--nats", help="NATS URL (default: the credentials' url, else the local one)")
    parser.add_argument("--submitter", default=f"{getpass.getuser()}@{socket.gethostname()}")
    args = parser.parse_args()

    with open(args.file, encoding="utf-8") as f:
        spec = yaml.safe_load(f)  # JSON is YAML too; merge keys (<<: *anchor) are applied
    key = idempotency_key(spec, args.run_id)
    event = cloud_event(spec, key, args.run_id, args.submitter)
    subject = f"allot.workload.submitted.{spec['metadata']['team']}"

    login = {}
    url = "nats://127.0.0.1:4222"
    if args.credentials:
        with open(args.credentials, encoding="utf-8") as f:
            creds = json.load(f)
        login = {"user": creds["user"], "password": creds["password"]}
        url = creds["url"]
    nc = await nats.connect(args.nats or url, connect_timeout=2, **login)
    try:
        js = nc.jetstream()
        # Await the PubAck: a publish that was not acknowledged did not happen.
        try:
            ack = await js.publish(
                subject,
                json.dumps(event).encode(),
                timeout=5,
                headers={"Nats-Msg-Id": msg_id(spec, key)},
            )
        except nats.errors.TimeoutError:
            print(f"{event['subject']}: not acknowledged, so not submitted (may this user "
                  f"publish on {subject}? a team user may submit for its own team only)",
                  file=sys.stderr)
            return 1
    finally:
        await nc.drain()
    if ack.duplicate:
        print(f"{event['subject']}: already submitted ({ack.stream} sequence {ack.seq})",
              file=sys.stderr)
    else:
        print(f"{event['subject']}: stored as {ack.stream} sequence {ack.seq}", file=sys.stderr)
    print(event["subject"])
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

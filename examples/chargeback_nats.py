#!/usr/bin/env python3
"""A team's chargeback subscriber in Python, with the credentials `allot nats-config` gave it.

    pip install nats-py
    python3 examples/chargeback_nats.py nats-config/team-vision.credentials.json          # history
    python3 examples/chargeback_nats.py nats-config/team-vision.credentials.json --live   # from now

The history comes from the team's own stream (COSTS_<team>, in the team's NATS account) through a
durable consumer, so a restarted subscriber resumes where it stopped; --live subscribes to
allot.cost.<team>.> instead. Each message is a CloudEvents 1.0 JSON event:

  io.allot.cost.v1.accrued         one lease's cost over one period: data.workload, data.task_name,
                                   data.from_ms, data.to_ms, data.last, data.amount (integer
                                   micro-units of data.currency), data.lines[] per resource
  io.allot.cost.v1.budget_crossed  the team's spending crossed 80% (warning) or 100% (exceeded) of
                                   its budget, or a new period began (within)

Amounts are integers (micro-units): add them as integers, format only to print. An event that
arrives twice has the same CloudEvent id; count it once.
"""

import argparse
import asyncio
import json
import sys
from collections import defaultdict

import nats


def money(micros: int) -> str:
    sign = "-" if micros < 0 else ""
    m = abs(micros)
    return f"{sign}{m // 1_000_000}.{m % 1_000_000:06d}"


class Ledger:
    def __init__(self):
        self.seen = set()
        self.totals = defaultdict(int)

    def take(self, payload: bytes) -> None:
        event = json.loads(payload)
        if event["id"] in self.seen:
            return
        self.seen.add(event["id"])
        data = event["data"]
        if event["type"] == "io.allot.cost.v1.accrued":
            self.totals[data["workload"]] += data["amount"]
            kind = "final " if data["last"] else "period"
            print(f'{data["workload"]:<32} {data["task_name"]:<16} {kind} {money(data["amount"]):>12} '
                  f'(total {money(self.totals[data["workload"]])} {data["currency"]})')
        elif event["type"] == "io.allot.cost.v1.budget_crossed":
            print(f'BUDGET {data["level"]} for {data["team"]} in {data["period"]}: '
                  f'{money(data["spent"])} of {money(data["budget"])} {data["currency"]}')


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("credentials", help="team-<team>.credentials.json from allot nats-config")
    parser.add_argument("--live", action="store_true", help="only events from now on")
    parser.add_argument("--durable", default="chargeback-py",
                        help="the durable consumer's name (its position survives restarts)")
    args = parser.parse_args()
    with open(args.credentials) as f:
        creds = json.load(f)
    if "stream" not in creds:
        print("these are not a team's credentials", file=sys.stderr)
        return 2
    nc = await nats.connect(creds["url"], user=creds["user"], password=creds["password"],
                            name="chargeback")
    ledger = Ledger()
    if args.live:
        sub = await nc.subscribe(creds["live_subjects"])
        async for msg in sub.messages:
            ledger.take(msg.data)
        return 0
    js = nc.jetstream()
    sub = await js.pull_subscribe("", durable=args.durable, stream=creds["stream"])
    while True:
        try:
            msgs = await sub.fetch(100, timeout=5)
        except nats.errors.TimeoutError:
            continue
        for msg in msgs:
            ledger.take(msg.data)
            await msg.ack()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

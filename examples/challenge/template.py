#!/usr/bin/env python3
"""A client for `lockslab challenge`: speaks the protocol, takes NO lock yet.

Run it:  lockslab challenge counter -- /usr/bin/python3 client.py
(the system python3, which has the modules below; a venv's may not.)
Protocol (docs/challenge.md): one JSON object a line. stdin brings `init`, then
`job`s; stdout answers `ready`, then `ok` (or `fail`) for each job. Log on stderr.
Needs python3-redis and python3-psycopg2 (scripts/setup installs them).
"""
import json
import sys
import time

import psycopg2
import redis


def say(**message):
    # One line, flushed at once: lockslab reads it before it pauses or kills you.
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"])
r = redis.Redis.from_url(init["redis_url"])  # for your lock; keys start with init["key_prefix"]
# Under `failover` the redis_url primary dies mid-run: ask the Sentinels in init["sentinels"]
# ("host:port" strings) for the primary of init["master_name"] (they and the Redis servers
# demand init["redis_password"]), and ask them again when your connection fails.
table = init["table"]
say(type="ready", notes=True)

for line in sys.stdin:  # lockslab closes stdin when there are no more jobs
    job = json.loads(line)
    # TODO: take a lock here, and say(type="acquired", job=job["id"], token=...)
    with db, db.cursor() as cur:  # one transaction
        cur.execute(f"SELECT value, items FROM {table} WHERE record = %s",
                    (job["record"],))
        value, items = cur.fetchone()
        say(type="writing", job=job["id"])
        time.sleep(job["work_ms"] / 1000)  # the job's work, between read and write
        # What was read, plus the job's add, and its entry at the end of the items.
        cur.execute(
            f"UPDATE {table} SET value = %s, items = %s, job = %s"
            " WHERE record = %s",
            (value + job["add"], items + [job["append"]], job["id"],
             job["record"]),
        )
    # TODO: release the lock, and say(type="released", job=job["id"])
    say(type="ok", job=job["id"])

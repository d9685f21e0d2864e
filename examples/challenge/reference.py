#!/usr/bin/env python3
"""Reference clients for `lockslab challenge`, broken and fixed side by side.

    lockslab challenge counter -- python3 examples/challenge/reference.py none      # fails
    lockslab challenge counter -- python3 examples/challenge/reference.py setnx     # passes*
    lockslab challenge pause   -- python3 examples/challenge/reference.py setnx     # fails
    lockslab challenge pause   -- python3 examples/challenge/reference.py checked   # fails
    lockslab challenge pause   -- python3 examples/challenge/reference.py fenced    # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py claimed   # passes
    lockslab challenge delay   -- python3 examples/challenge/reference.py setnx     # fails
    lockslab challenge delay   -- python3 examples/challenge/reference.py checked   # fails
    lockslab challenge delay   -- python3 examples/challenge/reference.py claimed   # passes
    lockslab challenge crash   -- python3 examples/challenge/reference.py fenced    # fails
    lockslab challenge crash   -- python3 examples/challenge/reference.py once      # passes
    lockslab challenge crash   -- python3 examples/challenge/reference.py long      # fails
    lockslab challenge pause   -- python3 examples/challenge/reference.py long      # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py outlast   # fails
    lockslab challenge pause   -- python3 examples/challenge/reference.py outlast 30 # unknown
    lockslab challenge exactly-once -- python3 examples/challenge/reference.py fenced # fails
    lockslab challenge exactly-once -- python3 examples/challenge/reference.py once   # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py late      # fails, or undecided
    lockslab challenge delay   -- python3 examples/challenge/reference.py late      # undecided
    lockslab challenge pause   -- python3 examples/challenge/reference.py early     # never passes
    lockslab challenge crash   -- python3 examples/challenge/reference.py quiet     # fails
    lockslab challenge failover -- python3 examples/challenge/reference.py sentinel # fails
    lockslab challenge failover -- python3 examples/challenge/reference.py sequence # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py for-update # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py advisory  # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py try-advisory # passes
    lockslab challenge delay   -- python3 examples/challenge/reference.py nowait    # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py optimistic      # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py optimistic-fail # never done, often
    lockslab challenge pause   -- python3 examples/challenge/reference.py serializable # passes
    lockslab challenge delay   -- python3 examples/challenge/reference.py repeatable-read # passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py liar      # fails
    lockslab challenge crash   -- python3 examples/challenge/reference.py shuffled  # fails
    lockslab challenge pause   -- python3 examples/challenge/reference.py lastcheck # never passes
    lockslab challenge delay   -- python3 examples/challenge/reference.py lastcheck-select # never passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py unlock-early # fails
    lockslab challenge delay   -- python3 examples/challenge/reference.py del-early # fails
    lockslab challenge pause   -- python3 examples/challenge/reference.py lastcheck-decoy # never passes
    lockslab challenge pause   -- python3 examples/challenge/reference.py deadline-decoy # never passes
    lockslab challenge delay   -- python3 examples/challenge/reference.py lateclaim # never passes

Every mode reads the record's value and items, and writes value + add and the
items with the job's entry (`append`) at the end, in one UPDATE.

none    no lock: read, add, write. Two clients on one record lose an update.
setnx   Redis SET NX PX, released with compare-and-delete: the first lock most
        people write. A holder frozen past the TTL still writes what it read;
        so does one whose write is held in the network past the TTL.
checked setnx + a fencing token (Redis INCR) checked only at the write: the UPDATE
        lands if no newer token has written the row (lab 7's fenced-write-only).
        A newer holder that read before the older one's late write lands, and
        writes after it, passes that check too: the older write is lost. lockslab
        plays that order (it holds the newer holder just before its write and
        lets the held one go), so it fails pause and delay.
fenced  setnx + a fencing token (Redis INCR), checked by the client against the
        fence it read under the row lock (SELECT ... FOR UPDATE), in the same
        transaction as its write.
        That transaction stays open across the work, so its row lock is what
        keeps pause and delay from catching it: a frozen or delayed holder keeps
        the row and the others wait for it (lockslab reads that wait from
        pg_blocking_pids: the fault bit, and the lock held); the token never has
        a newer write to refuse.
        A holder killed after its commit, before its answer, has its job resent:
        done twice. A job delivered twice is done twice, too.
claimed-retry claimed that, fenced out (its claim or its write refused: a newer holder
        claimed the row), lets its lock go and tries the job again from the lock (a new
        `writing` note; `acquired` once, `released` at the end), instead of answering
        fail (up to 8 tries).
claimed setnx + a token that claims the row before the read, in its own short
        transaction; the work runs with no row lock held, and the write lands
        only if the row is still claimed by this token. No transaction stays
        open across the work: the token alone keeps a frozen holder out.
once    fenced + the job recorded as done in the same transaction: a resent (or
        twice delivered) job that already took effect is answered ok again, with
        no second effect.
late    setnx that lies: it says `writing` only after its write committed, so the
        faults aimed at that note find nothing left to hold up. They missed: the
        run is undecided, never a pass (the grader reads when the write landed).
        Under pause, the third pause lands in the middle of a job's work, and there
        the setnx lock breaks as ever when that pause comes after a read: on such
        seeds it fails.
early   setnx that lies the other way: it says `writing` before its read. A fault
        aimed at that note lands before anything was read; the grader sees, in
        the items each write carries, that the read came after the fault. The
        run is undecided or fails, never a pass.
quiet   fenced, sending no notes at all (`ready` with notes false). Faults are
        then aimed at its jobs and answers: `crash` kills it as its answer comes,
        the answer dies with it, and the resent job is done twice.
long    once, with a TTL of ten lease_ms "so that it never expires mid-job": the
        lock of a holder killed holding it keeps everyone waiting its whole TTL.
        Under pause and delay the fault lasts until that TTL is out; then the row
        lock holds the next holder off, and it passes.
outlast setnx with a TTL of ten lease_ms (or of N lease_ms: `outlast N`), hoping
        the fault ends before its key does. lockslab waits the key out (at most 12
        TTLs), lets a newer holder read, and the held write is stale: it fails. A
        TTL past the bound outlives the test: unknown, the bound named.
sentinel fenced, on the Redis primary the Sentinels name (failover), with a token
        per record from INCR there. The replica promoted after the primary's
        death missed the last INCRs: its tokens start again below those already
        written. The check refuses a smaller token, but lets an equal one
        through, and the counter climbs back to it: one token, two writes.
sequence sentinel, with the token from a Postgres sequence instead: the database
        that keeps the records keeps the counter, and it never goes back as
        long as that Postgres keeps what it commits (fsync and synchronous_commit
        on) and is not failed over to an asynchronous standby (values handed out
        on the old primary can be handed out again there). The challenge's
        private Postgres runs with fsync and synchronous_commit off and is never
        crashed.

for-update the lock is the row's: one transaction takes it (SELECT ... FOR UPDATE),
        then a token from a Postgres sequence (after the lock, so the tokens rise
        in commit order), works, writes, commits. A job whose entry is in the
        items read is done already: answered ok with no second effect. A frozen
        holder keeps the others waiting on its row: lockslab reads that from
        pg_blocking_pids, and the fault bit (the lock held them off). A dead
        holder's lock goes with its session.
advisory for-update, with a transaction-scoped advisory lock on the record
        (pg_advisory_xact_lock) taken before a plain read.
advisory-timeout advisory that waits at most 3 lease_ms for the lock (lock_timeout) and
        answers `fail` when it gives up, having written nothing: lockslab gives the
        job again. A fault that holds the others off lasts to its bound (12 TTLs),
        longer than the wait: the tries given up on meanwhile do not count against
        the job.
try-advisory advisory that never waits inside Postgres: it asks
        pg_try_advisory_xact_lock every 20ms until it is granted. Nobody is ever
        seen waiting (pg_blocking_pids is empty): lockslab reads instead that the
        frozen holder's session held the advisory lock (pg_locks) while another
        client with a job on the record made no change.
nowait  for-update with SELECT ... FOR UPDATE NOWAIT, asked again every 20ms while
        the row is locked: pg_locks lists no row locks, so lockslab reads the frozen
        holder's from the row itself (its xmax names the holder's open transaction,
        or a multixact whose members include it).
optimistic no lock at all (`ready` says `"lock": false`): read, work, then a
        compare-and-set, UPDATE ... WHERE value and items are still as read; on a
        compare that matched nothing, read again and retry, with a new `writing`
        note. A job whose entry is in the items read is done already (resent, or
        delivered twice): answered ok with no second effect. The statement log
        shows each refused compare, so a fault that made one bit.
optimistic-fail optimistic that answers `fail` on a lost compare instead of retrying:
        lockslab gives the job again. As safe, but not live: three clients on two
        records lose a compare often, and a job that loses five tries in a row is
        never done — it fails most seeds on that alone.
serializable, repeatable-read  no lock, no compare in the SQL: read, work and
        write in one transaction at that isolation level, and let Postgres refuse
        the UPDATE of a row another transaction changed and committed after this
        one's snapshot (SQLSTATE 40001, a serialization failure: the transaction
        keeps nothing); roll back, read again and retry, with a new `writing` note
        (a deadlock, 40P01, likewise). At repeatable-read this is enough only
        because the write goes to the very row the decision was read from. The refused transaction leaves
        nothing in the statement log; lockslab's proxy sees the server abort it,
        and counts that as the refusal.
liar    setnx with a lease of 3.5 lease_ms, that answers `fail` whenever its job took
        longer than one lease_ms, though its write committed (and, sent the job
        again, finds its entry there and answers ok without writing). A `fail` is
        a claim: the log shows the write the client said did not happen, and the
        run fails on it (never a refusal that made a fault bite).
shuffled long (a lease of ten lease_ms), that says `acquired` and `writing` only
        after `released`: notes out of order hide the lock a dead holder left
        stuck. The client is misbehaving, and is named so.
lastcheck setnx that asks, after its work and just before its write, "is the key
        still mine, with more than 50ms left?" (lab 9's guard, marked there as
        not enough). A pause or a hold aimed at the write itself, not at the
        `writing` note before the check, lands after the check: never a pass.
lastcheck-select lastcheck that sends a harmless `SELECT 1` after its work, before its
        check: a delay that held whatever bytes came first after the note held that,
        and the check then saw the lock gone. Held at its write instead: never a pass.
lastcheck-decoy lastcheck that sends, before its check, UPDATEs of the records that
        match no row (`... AND false`), one more each job than any job of the run
        before (a counter in Redis): a fault aimed at the first write after the note,
        or the Nth, would land on one and the check would come after. lockslab tries
        each write first (rolled back) and lets those that match nothing by: never a
        pass.
deadline-decoy setnx that, before its write, sends UPDATEs that claim the row
        (`SET fence = fence + 1`) only while the database's clock is before a
        deadline it took when it read (`AND clock_timestamp() < ...`), one more each
        job than any job before; if one of them matches nothing, it answers `fail`
        and never writes. A fault aimed at the first write that changes a row would
        land on one of these, which the clock then refuses: the client would seem
        fenced out. lockslab aims at the first write that changes a record's value,
        items or job (what the log of changes records), so the fault lands on the
        unguarded write after them: never a pass.
lateclaim claimed, with the claim in the wrong place: after the read and the work, just
        before the write (which lands only if the row is still claimed by its token).
        A claim after the read fences nothing: an older holder's late write that lands
        between this holder's read and its claim is accepted (its token is still the
        row's), and then this holder claims and writes from its stale read, erasing it.
        The worst order holds a newer holder at its first write of the row — its claim
        here — so the older write lands in that gap: never a pass.
unlock-early the lock is a session advisory lock, asked with pg_try_advisory_lock every
        20ms (as try-advisory) in the job's transaction, and let go with
        pg_advisory_unlock after the UPDATE but before the COMMIT. Between the unlock
        and the commit the next holder takes the lock and reads the record without the
        write, which is not committed yet; its UPDATE waits for the row, then lands
        computed from that stale read. The window is a round trip wide, and a client
        asking every 20ms seldom lands in it; lockslab holds one fault's COMMIT (frozen,
        or its bytes held) to stretch it: it fails.
del-early setnx that deletes its key (the compare-and-delete) after the UPDATE but before
        the COMMIT: the same window, opened by a Redis lock. It fails the same way (and,
        a lease with no fence, at the write as setnx does).

* unless a client stalls past the TTL by itself (a busy machine does that): then
  `counter` catches what `pause` is about, with no fault injected.

Needs python3-redis and python3-psycopg2 (scripts/setup installs them).
"""
import json
import sys
import time
import uuid

import psycopg2
import psycopg2.errors
import redis

MODE = sys.argv[1] if len(sys.argv) > 1 else "none"
MODES = ("none", "setnx", "checked", "fenced", "claimed", "once", "long", "late", "early",
         "quiet", "sentinel", "sequence", "liar", "shuffled", "lastcheck", "lastcheck-select",
         "lastcheck-decoy", "deadline-decoy", "lateclaim",
         "optimistic", "optimistic-fail", "for-update", "advisory", "try-advisory", "nowait",
         "outlast", "claimed-retry", "advisory-timeout", "serializable", "repeatable-read",
         "unlock-early", "del-early")
assert MODE in MODES, f"unknown mode {MODE}"
EARLY, QUIET = MODE == "early", MODE == "quiet"
LIAR, SHUFFLED = MODE == "liar", MODE == "shuffled"
LASTCHECK, SELECT_FIRST = MODE.startswith("lastcheck"), MODE == "lastcheck-select"
DECOY = MODE == "lastcheck-decoy"
DEADLINE_DECOY = MODE == "deadline-decoy"
LATE_CLAIM = MODE == "lateclaim"
CLAIM_RETRY = MODE == "claimed-retry"
RETRY = MODE == "optimistic"
DEL_EARLY = MODE == "del-early"
MODE = {"del-early": "setnx", "early": "setnx", "quiet": "fenced", "liar": "setnx", "shuffled": "long",
        "lastcheck": "setnx", "lastcheck-select": "setnx", "lastcheck-decoy": "setnx",
        "deadline-decoy": "setnx", "lateclaim": "claimed",
        "optimistic-fail": "optimistic", "claimed-retry": "claimed"}.get(MODE, MODE)
NOTES = ("acquired", "writing", "released")

# Deletes the key only if it still holds our value: never someone else's lock.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


HELD = []  # shuffled: the notes of the job at hand, said after its `released`


def say(**message):
    if QUIET and message["type"] in NOTES:
        return
    if SHUFFLED and message["type"] in ("acquired", "writing"):
        HELD.append(message)
        return
    if SHUFFLED and message["type"] == "released":
        for held in [message] + HELD:
            sys.stdout.write(json.dumps(held) + "\n")
        HELD.clear()
        sys.stdout.flush()
        return
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"])
if LATE_CLAIM:  # each statement its own transaction: no COMMIT for a fault to land on
    auto = psycopg2.connect(init["postgres_url"])
    auto.autocommit = True
if MODE in ("sentinel", "sequence"):
    from redis.sentinel import Sentinel
    password, timeouts = init["redis_password"], {"socket_timeout": 0.5}
    hosts = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in init["sentinels"]]
    sentinels = Sentinel(hosts, password=password, sentinel_kwargs={"password": password, **timeouts},
                         **timeouts)
    r = sentinels.master_for(init["master_name"])  # asks them again on each new connection
else:
    r = redis.Redis.from_url(init["redis_url"])
table, prefix, ttl = init["table"], init["key_prefix"], init["lease_ms"]
if MODE == "long":
    ttl, MODE = 10 * ttl, "once"
if MODE == "outlast":
    times = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 10
    ttl, MODE = times * ttl, "setnx"
if LIAR:
    ttl = 7 * ttl // 2
if MODE == "once":
    with db, db.cursor() as cur:  # every client creates it; the first one wins
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (init["schema"],))
        cur.execute(f"CREATE TABLE IF NOT EXISTS {init['schema']}.done (job bigint PRIMARY KEY)")
if MODE in ("sequence", "for-update", "advisory", "advisory-timeout", "try-advisory", "nowait"):
    with db, db.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (init["schema"],))
        cur.execute(f"CREATE SEQUENCE IF NOT EXISTS {init['schema']}.tokens")
ISOLATED = MODE in ("serializable", "repeatable-read")
if ISOLATED:
    db.set_session(isolation_level=MODE.upper().replace("-", " "))
say(type="ready", notes=not QUIET, lock=MODE not in ("none", "optimistic") and not ISOLATED)


def retried(call):
    """A Redis call, again while the primary is dead and no replica promoted yet (10 s)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return call()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                redis.exceptions.ReadOnlyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def acquire(record):
    """SET NX PX until it is ours (at most 10 s); returns (key, owner value, token)."""
    key, owner = f"{prefix}lock:{record}", str(uuid.uuid4())
    OWNERS[key] = owner
    deadline = time.monotonic() + 10
    while not retried(lambda: r.set(key, owner, nx=True, px=ttl)):
        if time.monotonic() > deadline:
            return None
        # Asked again every 20 ms: soon enough after a 500 ms lease runs out, and a client
        # waiting out a frozen holder's lease does not spin a core meanwhile.
        time.sleep(0.02)
    token = None
    if MODE in ("checked", "fenced", "claimed", "once"):
        token = r.incr(f"{prefix}token")
    elif MODE == "sentinel":
        token = retried(lambda: r.incr(f"{prefix}token:{record}"))
    elif MODE == "sequence":
        with db, db.cursor() as cur:
            cur.execute(f"SELECT nextval('{init['schema']}.tokens')")
            (token,) = cur.fetchone()
    return key, owner, token


def do_claimed(job, token):
    """Claim the row with the token (and read it), work, then write if still claimed."""
    with db, db.cursor() as cur:
        cur.execute(f"UPDATE {table} SET fence = %s WHERE record = %s"
                    " AND (fence IS NULL OR fence < %s) RETURNING value, items",
                    (token, job["record"], token))
        row = cur.fetchone()
    if row is None:
        return False  # a newer holder claimed it already
    say(type="writing", job=job["id"])
    time.sleep(job["work_ms"] / 1000)  # the work, no row lock held
    with db, db.cursor() as cur:
        cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s"
                    " WHERE record = %s AND fence = %s",
                    (row[0] + job["add"], row[1] + [job["append"]], job["id"], job["record"],
                     token))
        return cur.rowcount == 1


def do_late_claim(job, token):
    """claimed's statements in the wrong order: read, work, claim, write. Broken."""
    cur = auto.cursor()
    cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
    value, items = cur.fetchone()
    say(type="writing", job=job["id"])
    time.sleep(job["work_ms"] / 1000)
    # Too late: an older holder's write that landed since the read is not refused by this
    # claim, and the write below erases it.
    cur.execute(f"UPDATE {table} SET fence = %s WHERE record = %s"
                " AND (fence IS NULL OR fence < %s)", (token, job["record"], token))
    if cur.rowcount == 0:
        return False
    cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s"
                " WHERE record = %s AND fence = %s",
                (value + job["add"], items + [job["append"]], job["id"], job["record"], token))
    return cur.rowcount == 1


def do_checked(job, token):
    """Read, work, then write only if no newer token wrote first: a check at the write."""
    with db, db.cursor() as cur:
        cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
        value, items = cur.fetchone()
    say(type="writing", job=job["id"])
    time.sleep(job["work_ms"] / 1000)  # the work, no row lock held
    with db, db.cursor() as cur:
        cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s, fence = %s"
                    " WHERE record = %s AND (fence IS NULL OR fence <= %s)",
                    (value + job["add"], items + [job["append"]], job["id"], token,
                     job["record"], token))
        return cur.rowcount == 1


OWNERS = {}  # lastcheck: the value our lock of each record holds


def still_mine(record):
    """lastcheck's guard: the key still ours, with more than 50ms of its TTL left."""
    key = f"{prefix}lock:{record}"
    return r.get(key) == OWNERS.get(key, "").encode() and r.pttl(key) > 50


def entry_there(job):
    """liar: a resent job whose entry is there already is answered ok, not done again."""
    with db, db.cursor() as cur:
        cur.execute(f"SELECT %s = ANY(items) FROM {table} WHERE record = %s",
                    (job["append"], job["record"]))
        return cur.fetchone()[0]


def do_in_postgres(job):
    """for-update, advisory: the lock is Postgres's, held by the one transaction that reads,
    works and writes; the token is taken under it."""
    if MODE == "nowait":
        return do_nowait(job)
    with db, db.cursor() as cur:
        if MODE == "try-advisory":
            lock = f"{table}/{job['record']}"
            while True:  # asked again in the same transaction: a refusal aborts nothing
                cur.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", (lock,))
                if cur.fetchone()[0]:
                    break
                time.sleep(0.02)
            cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
        elif MODE == "advisory":
            cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"{table}/{job['record']}",))
            cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
        elif MODE == "advisory-timeout":
            cur.execute(f"SET LOCAL lock_timeout = {3 * ttl}")
            try:
                cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))",
                            (f"{table}/{job['record']}",))
            except psycopg2.errors.LockNotAvailable:
                return False  # gave up waiting: nothing written, the job answered fail
            cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
        else:
            cur.execute(f"SELECT value, items FROM {table} WHERE record = %s FOR UPDATE",
                        (job["record"],))
        value, items = cur.fetchone()
        cur.execute(f"SELECT nextval('{init['schema']}.tokens')")
        (token,) = cur.fetchone()
        say(type="acquired", job=job["id"], token=token)
        if job["append"] not in items:  # else done already, by an earlier delivery
            say(type="writing", job=job["id"])
            time.sleep(job["work_ms"] / 1000)  # the work, the lock held
            cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s, fence = %s"
                        " WHERE record = %s",
                        (value + job["add"], items + [job["append"]], job["id"], token,
                         job["record"]))
    say(type="released", job=job["id"])  # the commit let the lock go
    return True


def do_unlock_early(job):
    """unlock-early: a session advisory lock, let go before the COMMIT (the bug)."""
    lock = f"{table}/{job['record']}"
    with db.cursor() as cur:  # psycopg2 opens the transaction (BEGIN) with this statement
        while True:  # a session lock: it outlives the transaction, until unlocked
            cur.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (lock,))
            if cur.fetchone()[0]:
                break
            time.sleep(0.02)
        say(type="acquired", job=job["id"])
        cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
        value, items = cur.fetchone()
        say(type="writing", job=job["id"])
        time.sleep(job["work_ms"] / 1000)  # the work, the lock held
        cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s WHERE record = %s",
                    (value + job["add"], items + [job["append"]], job["id"], job["record"]))
        cur.execute("SELECT pg_advisory_unlock(hashtext(%s))", (lock,))  # too early
        say(type="released", job=job["id"])
    db.commit()  # the write is committed only now
    return True


def do_nowait(job):
    """nowait: for-update that never waits for the row lock; a locked row is asked again."""
    while True:
        try:
            with db, db.cursor() as cur:
                cur.execute(f"SELECT value, items FROM {table} WHERE record = %s"
                            " FOR UPDATE NOWAIT", (job["record"],))
                value, items = cur.fetchone()
                cur.execute(f"SELECT nextval('{init['schema']}.tokens')")
                (token,) = cur.fetchone()
                say(type="acquired", job=job["id"], token=token)
                if job["append"] not in items:
                    say(type="writing", job=job["id"])
                    time.sleep(job["work_ms"] / 1000)
                    cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s,"
                                " fence = %s WHERE record = %s",
                                (value + job["add"], items + [job["append"]], job["id"],
                                 token, job["record"]))
            say(type="released", job=job["id"])
            return True
        except psycopg2.errors.LockNotAvailable:
            time.sleep(0.02)  # the row is another's: the transaction rolled back


def do_optimistic(job):
    """Compare-and-set: read, work, write only if the row is still as read. A lost compare
    is read again and retried (optimistic), or answered fail (optimistic-fail)."""
    while True:
        with db, db.cursor() as cur:
            cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
            value, items = cur.fetchone()
        if job["append"] in items:
            return True  # done already, by an earlier delivery: no second effect
        say(type="writing", job=job["id"])
        time.sleep(job["work_ms"] / 1000)  # the work, between read and write
        with db, db.cursor() as cur:  # committed even when it matched nothing: the evidence
            cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s"
                        " WHERE record = %s AND value = %s AND items = %s",
                        (value + job["add"], items + [job["append"]], job["id"],
                         job["record"], value, items))
            if cur.rowcount == 1:
                return True
        if not RETRY:
            return False


def do_isolated(job):
    """Read, work and write in one transaction at REPEATABLE READ or SERIALIZABLE: Postgres
    refuses the write (or the commit) with a serialization failure if another transaction
    committed a change the read did not see. Then read again and retry."""
    while True:
        try:
            with db, db.cursor() as cur:
                cur.execute(f"SELECT value, items FROM {table} WHERE record = %s",
                            (job["record"],))
                value, items = cur.fetchone()
                if job["append"] in items:
                    return True  # done already, by an earlier delivery
                say(type="writing", job=job["id"])
                time.sleep(job["work_ms"] / 1000)  # the work, between read and write
                cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s"
                            " WHERE record = %s",
                            (value + job["add"], items + [job["append"]], job["id"],
                             job["record"]))
            return True
        except (psycopg2.errors.SerializationFailure, psycopg2.errors.DeadlockDetected):
            pass  # rolled back by the `with`: nothing of it was kept; read again


def do(job, token):
    """One transaction: read, add, write. Returns False if fenced out."""
    if MODE == "optimistic":
        return do_optimistic(job)
    if ISOLATED:
        return do_isolated(job)
    if MODE == "unlock-early":
        return do_unlock_early(job)
    if MODE in ("for-update", "advisory", "advisory-timeout", "try-advisory", "nowait"):
        return do_in_postgres(job)
    if LATE_CLAIM:
        return do_late_claim(job, token)
    if MODE == "claimed":
        return do_claimed(job, token)
    if MODE == "checked":
        return do_checked(job, token)
    if MODE == "late":
        with db, db.cursor() as cur:
            cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
            value, items = cur.fetchone()
            time.sleep(job["work_ms"] / 1000)
            cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s WHERE record = %s",
                        (value + job["add"], items + [job["append"]], job["id"], job["record"]))
        say(type="writing", job=job["id"])  # the lie: after the commit, not before the write
        return True
    with db, db.cursor() as cur:
        if MODE in ("fenced", "once", "sentinel", "sequence"):
            # Fence the read: lock the row, and refuse if a newer holder wrote it.
            # The row lock is held until the commit, across the work below: while
            # this client is frozen nobody else can write the row, so it is the row
            # lock, not the token, that keeps a stale write out (see `claimed`).
            cur.execute(f"SELECT value, items, fence FROM {table} WHERE record = %s FOR UPDATE",
                        (job["record"],))
            value, items, fence = cur.fetchone()
            if fence is not None and fence > token:
                return False
        else:
            if DEADLINE_DECOY:  # most of the lease, on the database's clock
                cur.execute("SELECT clock_timestamp() + %s * interval '1 millisecond'",
                            (ttl * 0.8,))
                (deadline,) = cur.fetchone()
            if EARLY:
                say(type="writing", job=job["id"])  # the lie: before the read
            cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
            value, items = cur.fetchone()
        if MODE == "once":
            cur.execute(f"INSERT INTO {init['schema']}.done VALUES (%s) ON CONFLICT DO NOTHING",
                        (job["id"],))
            if cur.rowcount == 0:
                return True  # done before, by a client that died before answering
        if not EARLY:
            say(type="writing", job=job["id"])
        time.sleep(job["work_ms"] / 1000)  # the job's work, between read and write
        if SELECT_FIRST:
            cur.execute("SELECT 1")  # harmless: only the bytes before the check
        if DECOY:  # writes that match nothing, to take a fault aimed at the first write
            # one more each job than any job of the run before: more than any ok job sent
            for _ in range(r.incr(f"{prefix}decoys")):
                cur.execute(f"UPDATE {table} SET value = value WHERE record = %s AND false",
                            (job["record"],))
        if DEADLINE_DECOY:  # claims that only the database's clock can refuse
            for _ in range(r.incr(f"{prefix}decoys")):
                cur.execute(f"UPDATE {table} SET fence = coalesce(fence, 0) + 1"
                            " WHERE record = %s AND clock_timestamp() < %s",
                            (job["record"], deadline))
                db.commit()  # each on its own: no row lock held from one to the next
                if cur.rowcount == 0:
                    return False  # "fenced out": in truth, the clock said it was late
        if LASTCHECK and not still_mine(job["record"]):
            return False  # the guard: the lock is gone or nearly, so do not write
        cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s, fence = %s"
                    " WHERE record = %s",
                    (value + job["add"], items + [job["append"]], job["id"], token,
                     job["record"]))
        if DEL_EARLY:  # the key deleted before the COMMIT that ends this `with`: too early
            r.eval(RELEASE, 1, *LOCK)
            say(type="released", job=job["id"])
    return True


LOCK = ()  # del-early: the key and the owner value of the lock held now


for line in sys.stdin:
    job = json.loads(line)
    lock = None
    if LIAR and entry_there(job):
        say(type="ok", job=job["id"])
        continue
    began = time.monotonic()
    if CLAIM_RETRY:
        done = False
        for attempt in range(8):
            lock = acquire(job["record"])
            if lock is None:
                break
            if attempt == 0:  # the notes of a retry: only its `writing` (acquired once)
                say(type="acquired", job=job["id"], token=lock[2])
            done = do(job, lock[2])
            r.eval(RELEASE, 1, lock[0], lock[1])
            if done:
                break
        if lock or done:
            say(type="released", job=job["id"])
        if done:
            say(type="ok", job=job["id"])
        else:
            say(type="fail", job=job["id"], reason="fenced out 8 times, or no lock")
        continue
    if MODE not in ("none", "optimistic", "for-update", "advisory", "advisory-timeout",
                    "try-advisory", "nowait", "unlock-early") and not ISOLATED:
        lock = acquire(job["record"])
        if lock is None:
            say(type="fail", job=job["id"], reason="no lock within 10s")
            continue
        say(type="acquired", job=job["id"], token=lock[2])
        LOCK = lock[:2]
    done = do(job, lock[2] if lock else None)
    if lock and not DEL_EARLY:
        try:
            r.eval(RELEASE, 1, lock[0], lock[1])
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            pass  # the primary died with the lock on it: nothing left to release there
        say(type="released", job=job["id"])
    if LIAR and done and time.monotonic() - began > init["lease_ms"] / 1000:
        say(type="fail", job=job["id"], reason="it took too long: perhaps it did not land")
    elif done:
        say(type="ok", job=job["id"])
    else:
        say(type="fail", job=job["id"], reason="refused: a newer write came first")

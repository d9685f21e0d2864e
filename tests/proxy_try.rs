//! The proxy tries a caught write in the client's own session before a fault lands on it,
//! and rolls it back (`proxy::dry_run`): against a real Postgres, a write that matches
//! nothing goes straight by, one that updates the records is held and said to, a
//! transaction of the client's survives its try, and a try that cannot tell says why. The
//! rows are counted as the challenge counts them: a statement trigger's log, per session.

use std::time::{Duration, Instant};

use lockslab::proxy::{self, Direction, NetFault, Probe, Proxy, Seen, Tried};
use postgres::{Client, NoTls};

use crate::common::{eventually, servers};

struct Bench {
    proxy: Proxy,
    /// The client's connection, through the proxy (lent to a thread while it sends).
    client: Option<Client>,
    other: Client,
    table: String,
    schema: String,
}

impl Bench {
    fn new(name: &str) -> Bench {
        let url = &servers().postgres;
        let schema = format!("lockslab_try_{name}_{}", std::process::id());
        let table = format!("{schema}.records");
        let mut other = Client::connect(url, NoTls).unwrap();
        other
            .batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .unwrap();
        // The run's own records, logs and try functions: what a challenge grades from.
        let records = ["r0".to_string(), "r1".to_string()];
        let probe = lockslab::challenge::create_records_for_tests(url, &schema, &records).unwrap();
        let proxy = Proxy::start("test→postgres", proxy::upstream_of(url).unwrap()).unwrap();
        proxy.watch_writes(&table);
        proxy.try_writes(probe);
        let client = Client::connect(&proxy::through(url, proxy.addr()).unwrap(), NoTls).unwrap();
        Bench {
            proxy,
            client: Some(client),
            other,
            table,
            schema,
        }
    }

    fn value(&mut self, record: &str) -> i64 {
        value(&mut self.other, &self.table, record)
    }

    fn seen(&self) -> Vec<Seen> {
        seen(&self.proxy)
    }

    fn client(&mut self) -> &mut Client {
        self.client.as_mut().expect("the client's connection")
    }

    /// Sends `sql` as a simple query from a thread of its own (it may be held there).
    fn send(&mut self, sql: String) -> Sent {
        self.send_with(move |client| client.simple_query(&sql).map(|_| ()))
    }

    fn send_with(
        &mut self,
        call: impl FnOnce(&mut Client) -> Result<(), postgres::Error> + Send + 'static,
    ) -> Sent {
        let mut client = self.client.take().expect("the client's connection");
        std::thread::spawn(move || {
            let result = call(&mut client);
            (client, result.map_err(|e| e.to_string()))
        })
    }

    /// What `send` sent, answered within 10s — not held: a write held by mistake fails the
    /// test instead of hanging it.
    fn answered_at_once(&mut self, sent: Sent) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sent.is_finished() {
            assert!(Instant::now() < deadline, "held: {:?}", self.seen());
            std::thread::sleep(Duration::from_millis(10));
        }
        self.answer(sent)
    }

    /// The answer to what `send` sent; the connection comes back.
    fn answer(&mut self, sent: Sent) -> Result<(), String> {
        let (client, result) = sent.join().unwrap();
        self.client = Some(client);
        result
    }
}

type Sent = std::thread::JoinHandle<(Client, Result<(), String>)>;

fn value(other: &mut Client, table: &str, record: &str) -> i64 {
    let sql = format!("SELECT value FROM {table} WHERE record = $1");
    other.query_one(&sql, &[&record]).unwrap().get(0)
}

fn seen(proxy: &Proxy) -> Vec<Seen> {
    proxy.reports().into_iter().map(|r| r.seen).collect()
}

/// Waits for the proxy to report what it caught (an earlier held write's going out aside).
fn caught(proxy: &Proxy) -> Vec<Seen> {
    let mut all = Vec::new();
    eventually(Duration::from_secs(10), || {
        let now = seen(proxy).into_iter();
        all.extend(now.filter(|s| !matches!(s, Seen::DelayedSent { .. })));
        all.iter().any(|s| matches!(s, Seen::WriteHeld { .. }))
    });
    all
}

impl Drop for Bench {
    fn drop(&mut self) {
        self.proxy.stop();
        let schema = &self.schema;
        let _ = (self.other).batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    }
}

#[test]
fn a_write_that_matches_nothing_goes_by_and_the_one_that_changes_the_records_is_held() {
    let mut bench = Bench::new("held");
    let table = bench.table.clone();
    bench.proxy.set(Direction::Up, NetFault::HoldWrite);
    // Extended protocol (a named statement, bound), and a simple query: neither is held.
    let decoy = format!("UPDATE {table} SET value = value + 1 WHERE record = $1 AND false");
    let sent = bench.send_with(move |client| client.execute(&decoy, &[&"r0"]).map(|_| ()));
    bench.answered_at_once(sent).unwrap();
    let simple = format!("UPDATE {table} SET value = 9 WHERE record = 'r9'");
    let sent = bench.send(simple);
    bench.answered_at_once(sent).unwrap();
    // A row updated to what it was: no job's effect.
    let same = format!("UPDATE {table} SET value = value WHERE record = 'r0'");
    let sent = bench.send(same);
    bench.answered_at_once(sent).unwrap();
    // A claim of the row — a new fence, and nothing the log of changes records: the hostile
    // tester's `SET fence = fence + 1 … AND clock_timestamp() < deadline`, sent ahead of a
    // blind write to take the fault there, and then refused by the database's clock. The
    // fault waits for the write that changes the value, the items or the job.
    let claim = format!("UPDATE {table} SET fence = coalesce(fence, 0) + 1 WHERE record = 'r0'");
    let sent = bench.send(claim);
    bench.answered_at_once(sent).unwrap();
    assert_eq!(
        bench.seen(),
        vec![Seen::WriteChangedNothing; 4],
        "no row matched, or none changed what the log records: nothing held"
    );
    assert_eq!(bench.proxy.fault(Direction::Up), Some(NetFault::HoldWrite));
    // The write that changes r0 is caught, tried, and held; its try left no trace.
    let sent = bench.send(format!(
        "UPDATE {table} SET value = value + 5 WHERE record = 'r0'"
    ));
    let seen = caught(&bench.proxy);
    bench.proxy.clear(Direction::Up);
    bench.answer(sent).unwrap();
    assert!(
        matches!(
            seen[..],
            [Seen::WriteHeld {
                tried: Tried::Changes,
                session: Some(_),
                ..
            }]
        ),
        "{seen:?}"
    );
    assert_eq!(bench.value("r0"), 5, "the real write, once");
}

/// Where lockslab holds a newer holder just before its write (the worst order), a claim
/// counts: the newer holder's first write of the row that changes anything is held, a new
/// fence alone too — a claim made after the read would otherwise land first and refuse the
/// older write, and the order would test nothing (the hostile tester's `lateclaim`).
#[test]
fn a_newer_holder_is_held_at_its_claim_and_an_unchanged_row_still_goes_by() {
    let mut bench = Bench::new("touch");
    let table = bench.table.clone();
    bench.proxy.set(Direction::Up, NetFault::HoldFirstTouch);
    let same = format!("UPDATE {table} SET fence = fence WHERE record = 'r0'");
    let sent = bench.send(same);
    bench.answered_at_once(sent).unwrap();
    assert_eq!(bench.seen(), vec![Seen::WriteChangedNothing]);
    let sent = bench.send(format!(
        "UPDATE {table} SET fence = 7 WHERE record = 'r0' AND (fence IS NULL OR fence < 7)"
    ));
    let seen = caught(&bench.proxy);
    assert!(
        matches!(
            seen[..],
            [Seen::WriteHeld {
                tried: Tried::Claims,
                ..
            }]
        ),
        "{seen:?}"
    );
    let fence = |bench: &mut Bench| -> Option<i64> {
        let sql = format!("SELECT fence FROM {table} WHERE record = 'r0'");
        bench.other.query_one(&sql, &[]).unwrap().get(0)
    };
    assert_eq!(fence(&mut bench), None, "held before it ran");
    bench.proxy.clear(Direction::Up);
    bench.answer(sent).unwrap();
    assert_eq!(fence(&mut bench), Some(7), "the claim, once");
}

/// The held write runs in the try with the client's rights: one that rewrites what the try
/// counts from (a setting, built with `concat` so that no word of it shows, and set by
/// `query_to_xml` — the hostile tester's `letby`) still counts as the change it is, and is
/// held: the try's start is kept under a nonce in a table the client cannot write.
#[test]
fn a_write_that_rewrites_the_tries_mark_from_inside_is_held_all_the_same() {
    let mut bench = Bench::new("forge");
    let table = bench.table.clone();
    bench.proxy.set(Direction::Up, NetFault::HoldWrite);
    let sent = bench.send(format!(
        "UPDATE {table} SET value = value + 3 WHERE record = 'r1' AND query_to_xml(\
         concat('select set_con', 'fig(''lockslab.try_mark'', ''999999'', true)'), \
         false, false, '') IS NOT NULL"
    ));
    let seen = caught(&bench.proxy);
    bench.proxy.clear(Direction::Up);
    bench.answer(sent).unwrap();
    // Not tried at all (`query_to_xml` runs SQL the batch does not show), or tried and
    // counted as the change it is: never a write that changes nothing.
    assert!(
        matches!(
            seen.last(),
            Some(Seen::WriteHeld {
                tried: Tried::Changes | Tried::Untried(_),
                ..
            })
        ) && !seen.contains(&Seen::WriteChangedNothing),
        "{seen:?}"
    );
    assert_eq!(bench.value("r1"), 3, "the real write, once");
}

/// A fault aimed at the commit holds the commit of a change, not a decoy: a write that
/// commits as it runs (outside a block) is tried first and let by if it changes nothing,
/// and a block whose writes of the records all changed nothing has its `COMMIT` let by. The
/// commit of a block that wrote, and a write of its own that changes a row, are held.
#[test]
fn a_fault_at_the_commit_lets_the_commit_of_nothing_by_and_holds_the_commit_of_a_change() {
    let mut bench = Bench::new("commit");
    let table = bench.table.clone();
    bench.proxy.set(Direction::Up, NetFault::HoldCommit);
    let decoy = format!("UPDATE {table} SET value = value + 1 WHERE record = 'r0' AND false");
    let sent = bench.send(decoy.clone());
    bench.answered_at_once(sent).unwrap();
    for sql in ["BEGIN".to_string(), decoy.clone(), "COMMIT".to_string()] {
        let sent = bench.send(sql);
        bench.answered_at_once(sent).unwrap();
    }
    // A change of another table in the block (the client's own) is no change of the records.
    let schema = bench.schema.clone();
    (bench.other)
        .batch_execute(&format!("CREATE TABLE {schema}.own (x int)"))
        .unwrap();
    let own = format!("INSERT INTO {schema}.own VALUES (0)");
    for sql in ["BEGIN".to_string(), decoy, own, "COMMIT".to_string()] {
        let sent = bench.send(sql);
        bench.answered_at_once(sent).unwrap();
    }
    assert_eq!(
        bench.seen(),
        vec![Seen::WriteChangedNothing; 3],
        "nothing of the records changed: no commit held"
    );
    assert_eq!(bench.proxy.fault(Direction::Up), Some(NetFault::HoldCommit));
    let write = format!("UPDATE {table} SET value = value + 5 WHERE record = 'r0'");
    let sent = bench.send(write.clone());
    let held = held_commit(&bench.proxy);
    assert_eq!(bench.value("r0"), 0, "held before it ran: {held:?}");
    bench.proxy.clear(Direction::Up);
    bench.answer(sent).unwrap();
    assert_eq!(bench.value("r0"), 5, "the real write, once");
    // In a block: the write goes on, and the COMMIT after it is held.
    bench.proxy.set(Direction::Up, NetFault::HoldCommit);
    for sql in ["BEGIN".to_string(), write] {
        let sent = bench.send(sql);
        bench.answered_at_once(sent).unwrap();
    }
    let sent = bench.send("COMMIT".to_string());
    held_commit(&bench.proxy);
    assert_eq!(bench.value("r0"), 5, "not committed while held");
    bench.proxy.clear(Direction::Up);
    bench.answer(sent).unwrap();
    assert_eq!(bench.value("r0"), 10);
    // A write inside a `WITH … SELECT` answers with the SELECT's tag: its commit is held.
    bench.proxy.set(Direction::Up, NetFault::HoldCommit);
    let hidden = format!(
        "WITH u AS (UPDATE {table} SET value = value + 1 WHERE record = 'r1' RETURNING 1) \
         SELECT count(*) FROM u"
    );
    for sql in ["BEGIN".to_string(), hidden] {
        let sent = bench.send(sql);
        bench.answered_at_once(sent).unwrap();
    }
    let sent = bench.send("COMMIT".to_string());
    held_commit(&bench.proxy);
    assert_eq!(bench.value("r1"), 0, "not committed while held");
    bench.proxy.clear(Direction::Up);
    bench.answer(sent).unwrap();
    assert_eq!(bench.value("r1"), 1);
}

/// Waits for the proxy to report a commit held, and returns what it reported.
fn held_commit(proxy: &Proxy) -> Vec<Seen> {
    let mut all = Vec::new();
    eventually(Duration::from_secs(10), || {
        all.extend(seen(proxy));
        all.iter().any(|s| matches!(s, Seen::CommitHeld { .. }))
    });
    all
}

/// A REPEATABLE READ transaction's write, held while another session commits a change to
/// the same row, is refused by the server when it goes through (40001): the proxy tells
/// that the transaction ended for that conflict, in its answer to the held write's own
/// request. A conflict the client provokes on a later statement is told with that
/// statement's request, so it is never taken for the held write's refusal.
#[test]
fn a_held_write_the_server_refuses_for_a_stale_snapshot_is_told_with_its_request() {
    let mut bench = Bench::new("stale");
    let table = bench.table.clone();
    let begin = format!(
        "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT value FROM {table} WHERE record = 'r0'"
    );
    bench.client().simple_query(&begin).unwrap();
    bench.proxy.set(Direction::Up, NetFault::HoldWrite);
    let sent = bench.send(format!("UPDATE {table} SET value = 1 WHERE record = 'r0'"));
    let seen = caught(&bench.proxy);
    let Some(&Seen::WriteHeld {
        tried: Tried::Changes,
        session: Some(session),
        request,
    }) = seen.last()
    else {
        panic!("not held as a write that changes the records: {seen:?}")
    };
    let concurrent = format!("UPDATE {table} SET value = 5 WHERE record = 'r0'");
    bench.other.execute(&concurrent, &[]).unwrap();
    bench.proxy.clear(Direction::Up);
    assert!(bench.answer(sent).is_err(), "refused");
    bench.client().simple_query("ROLLBACK").unwrap();
    let mut told = Vec::new();
    eventually(Duration::from_secs(10), || {
        told.extend(bench.seen().into_iter().filter_map(|s| match s {
            Seen::TransactionAborted {
                session,
                why,
                request,
            } => Some((session, why, request)),
            _ => None,
        }));
        !told.is_empty()
    });
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!((told[0].0, told[0].2), (Some(session), request), "{told:?}");
    assert!(told[0].1.starts_with("40001: "), "{told:?}");
    assert_eq!(bench.value("r0"), 5, "the refused write kept nothing");

    // The held write goes through; a statement after it, on r1, meets a conflict.
    bench.client().simple_query(&begin).unwrap();
    bench.proxy.set(Direction::Up, NetFault::HoldWrite);
    let sent = bench.send(format!("UPDATE {table} SET value = 2 WHERE record = 'r0'"));
    let seen = caught(&bench.proxy);
    let Some(&Seen::WriteHeld { request: held, .. }) = seen.last() else {
        panic!("not held: {seen:?}")
    };
    bench.proxy.clear(Direction::Up);
    bench.answer(sent).unwrap();
    let other_row = format!("UPDATE {table} SET value = 6 WHERE record = 'r1'");
    bench.other.execute(&other_row, &[]).unwrap();
    let later = format!("UPDATE {table} SET value = 3 WHERE record = 'r1'");
    assert!(bench.client().simple_query(&later).is_err());
    bench.client().simple_query("ROLLBACK").unwrap();
    let mut later_told = Vec::new();
    eventually(Duration::from_secs(10), || {
        later_told.extend(bench.seen().into_iter().filter_map(|s| match s {
            Seen::TransactionAborted { request, .. } => Some(request),
            _ => None,
        }));
        !later_told.is_empty()
    });
    assert_eq!(later_told.len(), 1, "{later_told:?}");
    assert!(later_told[0] > held, "{later_told:?} after the held {held}");
}

#[test]
fn a_transaction_of_the_clients_keeps_its_work_through_the_try() {
    let mut bench = Bench::new("txn");
    let table = bench.table.clone();
    bench
        .proxy
        .set(Direction::Up, NetFault::DelayWrite { ms: 200 });
    let mut txn = bench.client().transaction().unwrap();
    let first = format!("UPDATE {table} SET value = 7 WHERE record = 'r1' AND false");
    txn.execute(&first, &[]).unwrap();
    let write = format!("UPDATE {table} SET value = value + 8 WHERE record = 'r1'");
    let started = Instant::now();
    assert_eq!(txn.execute(&write, &[]).unwrap(), 1);
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "it was held"
    );
    let read = format!("SELECT value FROM {table} WHERE record = 'r1'");
    let value: i64 = txn.query_one(&read, &[]).unwrap().get(0);
    assert_eq!(value, 8, "the write once, in the transaction");
    txn.commit().unwrap();
    assert_eq!(bench.value("r1"), 8);
    let seen = bench.seen();
    assert!(
        matches!(
            seen[..],
            [
                Seen::WriteChangedNothing,
                Seen::WriteHeld {
                    tried: Tried::Changes,
                    ..
                },
                ..
            ]
        ),
        "{seen:?}"
    );
}

#[test]
fn a_try_that_cannot_tell_says_why_and_the_write_is_held_all_the_same() {
    let mut bench = Bench::new("untold");
    let table = bench.table.clone();
    // Another session holds r0's row lock: the try waits past its lock timeout.
    let mut blocker = Client::connect(&servers().postgres, NoTls).unwrap();
    let mut holding = blocker.transaction().unwrap();
    let lock = format!("SELECT value FROM {table} WHERE record = 'r0' FOR UPDATE");
    holding.query_one(&lock, &[]).unwrap();
    bench.proxy.set(Direction::Up, NetFault::HoldWrite);
    let sent = bench.send(format!("UPDATE {table} SET value = 3 WHERE record = 'r0'"));
    let seen = caught(&bench.proxy);
    bench.proxy.clear(Direction::Up);
    holding.commit().unwrap();
    bench.answer(sent).unwrap();
    assert!(
        matches!(&seen[..], [Seen::WriteUntried { why }, Seen::WriteHeld { tried: Tried::Untried(_), .. }]
            if why.contains("lock timeout")),
        "{seen:?}"
    );
    assert_eq!(bench.value("r0"), 3);
    // A batch that would commit the try is not tried at all.
    bench.proxy.set(Direction::Up, NetFault::HoldWrite);
    let sent = bench.send(format!(
        "UPDATE {table} SET value = 4 WHERE record = 'r0'; COMMIT"
    ));
    let seen = caught(&bench.proxy);
    bench.proxy.clear(Direction::Up);
    let _ = bench.answer(sent);
    assert!(
        matches!(&seen[..], [Seen::WriteUntried { why }, Seen::WriteHeld { .. }]
            if why.contains("not a plain read or write")),
        "{seen:?}"
    );
    assert_eq!(bench.value("r0"), 4);
}

/// A proxy that signs in for its client: the client's password opens the proxy only, the
/// login's own opens the server only — so no session of the login can go around the proxy.
#[test]
fn a_proxy_that_signs_in_keeps_the_logins_password_from_its_client() {
    let url = &servers().postgres;
    let login = format!("lockslab_sign_in_{}", std::process::id());
    let (given, real) = ("given-to-the-client", "kept-by-lockslab");
    let mut admin = Client::connect(&servers().postgres_admin, NoTls).unwrap();
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {login}; CREATE ROLE {login} LOGIN PASSWORD '{real}'"
        ))
        .unwrap();
    let mut proxy = Proxy::start("test→postgres", proxy::upstream_of(url).unwrap()).unwrap();
    proxy.watch_writes("lockslab_sign_in_records");
    proxy.try_writes(Probe {
        begins: "unused".into(),
        changed: "unused".into(),
        touched: "unused".into(),
    });
    proxy.sign_in_for(proxy::SignIn {
        login: login.clone(),
        given: given.into(),
        real: real.into(),
    });
    let as_login = |password: &str, to: &str| {
        let (scheme_and_user, rest) = url.split_once('@').unwrap();
        let scheme = &scheme_and_user[..scheme_and_user.find("//").unwrap() + 2];
        let at = to.to_string() + &rest[rest.find('/').unwrap()..];
        format!("{scheme}{login}:{password}@{at}")
    };
    let server = proxy::upstream_of(url).unwrap().to_string();
    let through = proxy.addr().to_string();

    let mut client = Client::connect(&as_login(given, &through), NoTls).unwrap();
    let row = client
        .query_one("SELECT current_user::text, pg_backend_pid()", &[])
        .unwrap();
    assert_eq!(row.get::<_, String>(0), login);
    // The proxy still reads the server's side: it knows the session it opened.
    assert!(proxy.sessions().pids.contains(&row.get::<_, i32>(1)));

    let refused = |url: String| match Client::connect(&url, NoTls) {
        Ok(_) => panic!("{url} was let in"),
        Err(err) => format!("{err:?}"),
    };
    let straight = refused(as_login(given, &server));
    assert!(straight.contains("28P01"), "{straight}");
    let real_to_proxy = refused(as_login(real, &through));
    assert!(real_to_proxy.contains("28P01"), "{real_to_proxy}");
    let other_user = refused(url.replace(&server, &through));
    assert!(other_user.contains("28000"), "{other_user}");

    // libpq asks for TLS first (sslmode=prefer): the proxy says no, and signs in.
    let psql = lockslab::servers::find_binary("psql", lockslab::connect::Backend::Postgres);
    {
        let psql = psql.unwrap();
        let (host, port) = through.split_once(':').unwrap();
        let database = url.rsplit('/').next().unwrap().split('?').next().unwrap();
        let out = std::process::Command::new(psql)
            .args(["-XAtc", "SELECT current_user"])
            .arg(format!(
                "host={host} port={port} user={login} dbname={database} sslmode=prefer"
            ))
            .env("PGPASSWORD", given)
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            login,
            "{out:?}"
        );
    }
    drop(client);
    proxy.stop();
    let _ = admin.batch_execute(&format!("DROP ROLE IF EXISTS {login}"));
}

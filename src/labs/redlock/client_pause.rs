//! Scenario 4: the client pauses past its validity. Redlock cannot help; a fencing token
//! from an ordered, durable source can, its random value cannot. A's pause and resume are
//! the scenario's schedule ([`faults`]).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::scene::{READ_TIMEOUT, Scene, name, round};
use super::verdict::{GuardedWrite, ScenarioVerdict, guard_label};
use crate::check::{self, Finding};
use crate::events::What;
use crate::events::facts::{Expired, Wrote};
use crate::events::{Event, Kind};
use crate::labs::WorkerHandle;
use crate::labs::faults::{Faults, Until};
use crate::lock::redlock::{self, Attempt, Master, Redlock};
use crate::nemesis::schedule::{Anchor, Schedule, Step};
use crate::nemesis::{Fault, Note};
use crate::output::human;
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::redlock_client::{RedlockClientScript, Resources};

impl Scene {
    /// Scenario 4: the client pauses past its validity. Redlock cannot help; a fencing
    /// token from an ordered, durable source can, its random value cannot.
    pub(super) fn play_client_pause(
        &mut self,
        store_url: &str,
        sequence: &str,
    ) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        self.heading(
            "client-pause",
            "4. The client pauses (SIGSTOP) past its validity",
        );
        let mut store = Store::connect(store_url)?;
        store.prepare()?;
        store.create_token_sequence(sequence)?;
        let key = self.key("client-pause");
        let resources = Resources {
            unfenced: "redlock-unfenced".into(),
            claimed: "redlock-claimed".into(),
            late_claim: "redlock-claimed-late".into(),
            sequence: "redlock-by-sequence".into(),
        };
        let mut a = self.spawn_pausing_client(&key, store_url, sequence, &resources)?;
        let long = self.settings.ttl + Duration::from_secs(15);
        let acquired = self
            .stage
            .wait_for(long, "A to take the lock", |e| e.is("A", Kind::Acquired))?;
        // A's round ended before this moment, so its validity ends before `a_seen + validity`.
        let a_seen = Instant::now();
        let a_value = acquired.owner().unwrap_or_default().to_string();
        let a_validity = match &acquired.what {
            What::Acquired(got) => got.validity_ms.unwrap_or_default(),
            _ => 0,
        };
        self.values.push((a_value.clone(), "A".into()));
        let schedule = faults(resources.guarded("", 0).len() as u32);
        crate::labs::faults::show(&self.stage, &schedule);
        let mut faults = Faults::new(&schedule, &self.stage)
            .self_pausing("A")
            .saying(|cue| {
                Note::from(match cue.action.fault {
                    Fault::Pause => format!(
                        "sees A (pid {}) stopped; its validity was {a_validity}ms",
                        cue.pid
                    ),
                    _ => format!(
                        "sends SIGCONT to A after {}",
                        human(cue.held.unwrap_or_default())
                    ),
                })
            });
        self.stage
            .wait_for(long, "A to freeze itself", |e| e.is("A", Kind::Freezing))?;
        let frozen = Until::acted(Fault::Pause, "A", long);
        self.stage
            .play(&mut faults, &mut self.nemesis, &mut [&mut a], frozen)?;
        self.await_expiry(&key, &a_value, long)?;
        let (mut b_lock, b, b_asked) = self.b_takes_over(&key)?;
        // B's round started after A's validity ended (proved on this process's clock), or
        // the lab cannot tell: it never says "granted twice" without the evidence.
        let granted_twice = check::redlock::granted_twice_after_pause(
            self.since_start(a_seen),
            a_validity,
            self.since_start(b_asked),
        );
        self.b_writes(&mut store, sequence, &resources, &b.value)?;
        // B has written everything: the schedule's resume of A falls due now.
        let resumed = Until::done(long);
        self.stage
            .play(&mut faults, &mut self.nemesis, &mut [&mut a], resumed)?;
        self.stage
            .wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        a.finish(Duration::from_secs(5));
        self.release("B", &mut b_lock, &b);
        self.stage.drain();

        let rows = self.stale_writes(&mut store, &resources)?;
        let read = self.read_back(&key, "the masters at the end");
        let meaning = pause_meaning(&rows, a_validity, (b.granted, n), granted_twice)?;
        Ok(ScenarioVerdict {
            name: "client-pause",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: granted_twice.as_option(),
            stale_write: rows.first().map(|row| row.stale.clone()),
            meaning,
            guarded_writes: Some(rows),
            rounds: vec![round("B", &b)],
            read_back: read,
            prevented_by: "a fencing token from an ordered, durable source (a Postgres \
                           sequence, an etcd revision) checked by the store; not Redlock, and \
                           not its random value, even compare-and-set",
            schedule: Some(schedule),
            ..Default::default()
        })
    }

    /// Client A: a worker process (only a process can be frozen), which takes the lock on
    /// every master, stops itself, and on waking writes each resource its own way.
    fn spawn_pausing_client(
        &mut self,
        key: &str,
        store_url: &str,
        sequence: &str,
        resources: &Resources,
    ) -> Result<WorkerHandle> {
        let script = RedlockClientScript {
            name: "A".into(),
            masters: (0..self.n()).map(|i| (name(i), self.url(i))).collect(),
            key: key.into(),
            ttl_ms: self.settings.ttl.as_millis() as u64,
            drift_factor: self.settings.drift_factor,
            instance_timeout_ms: self.settings.instance_timeout.as_millis() as u64,
            retry_delay_max_ms: self.settings.retry_delay_max.as_millis() as u64,
            round: self.settings.round,
            wait_ms: 10_000,
            store_url: store_url.into(),
            run_id: self.run_id.clone(),
            token_sequence: sequence.into(),
            resources: resources.clone(),
        };
        self.stage.spawn("A", &WorkerSpec::RedlockClient(script))
    }

    /// Waits until no master holds A's value — each expires it by its own clock — and
    /// records that they all have.
    fn await_expiry(&mut self, key: &str, a_value: &str, long: Duration) -> Result<()> {
        let deadline = Instant::now() + long;
        loop {
            let holding = (0..self.n())
                .filter(|&i| {
                    let mut master = Master::new(&name(i), &self.url(i));
                    matches!(master.read(key, READ_TIMEOUT), Ok((Some(value), _)) if value == a_value)
                })
                .count();
            if holding == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "A's key did not expire on the masters within {}",
                    human(long)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stage.record(Event::new(
            "masters",
            Expired::default(),
            format!(
                "A's key has expired on all {} masters, each by its own clock",
                self.n()
            ),
        ));
        Ok(())
    }

    /// B asks until it holds the lock (a few seconds at most); returns its lock, its
    /// round, and when that round began.
    fn b_takes_over(&mut self, key: &str) -> Result<(Redlock, Attempt, Instant)> {
        let mut b_lock = self.lock(key);
        let mut b_asked = Instant::now();
        let mut b = self.acquire("B", &mut b_lock);
        let retry_until = Instant::now() + Duration::from_secs(5);
        while !b.held && Instant::now() < retry_until {
            std::thread::sleep(redlock::random_delay(self.settings.retry_delay_max));
            b_asked = Instant::now();
            b = self.acquire("B", &mut b_lock);
        }
        if !b.held {
            bail!("B did not get the lock after A's key expired everywhere");
        }
        Ok((b_lock, b, b_asked))
    }

    /// B, holding the lock: a token from the sequence, its claims by value, then its
    /// write to each resource, each guarded its own way.
    fn b_writes(
        &mut self,
        store: &mut Store,
        sequence: &str,
        resources: &Resources,
        b_value: &str,
    ) -> Result<()> {
        let b_token = store.next_token(sequence)?;
        for resource in [&resources.claimed, &resources.late_claim] {
            store.claim(&self.run_id, resource, "B", b_value);
        }
        self.stage.record(Event::new(
            "B",
            What::Working,
            format!(
                "token {b_token} from the sequence; claims {} and {} with its value",
                resources.claimed, resources.late_claim
            ),
        ));
        for (resource, guard) in resources.guarded(b_value, b_token) {
            let outcome = guard.write(store, &self.run_id, resource, "B", "B's result");
            self.stage.record(Event::new(
                "B",
                Wrote {
                    resource: Some(resource.to_string()),
                    token: guard.token(),
                    ..Wrote::new(outcome)
                },
                format!(
                    "writes 'B's result' to {resource} ({}): the store says {}",
                    guard.how(),
                    outcome.as_str()
                ),
            ));
        }
        Ok(())
    }

    /// Each resource read back from the store: A's stale write, taken or refused, and
    /// whose result it keeps; recorded as the store's word. Unfenced first.
    fn stale_writes(
        &mut self,
        store: &mut Store,
        resources: &Resources,
    ) -> Result<Vec<GuardedWrite>> {
        let mut rows = Vec::new();
        for (guard, resource) in [
            ("unfenced", &resources.unfenced),
            ("claim", &resources.claimed),
            ("late_claim", &resources.late_claim),
            ("sequence", &resources.sequence),
        ] {
            let read = store.read_back(&self.run_id, resource)?;
            if !check::last_accepted_is_final(&read.attempts, read.final_writer.as_deref()) {
                bail!("the store's record for {resource} disagrees with itself");
            }
            let row = GuardedWrite {
                guard,
                resource: resource.clone(),
                stale: check::redlock::stale_write(&read.attempts, "A", "B"),
                final_writer: read.final_writer,
            };
            if let Some(accepted) = row.stale.accepted {
                let verb = if accepted { "took" } else { "refused" };
                // Said, not recorded: the store's answer, not a fact of the history.
                self.stage.conclude(crate::labs::Conclusion {
                    lane: "store",
                    text: format!(
                        "{}: decided A's stale write after B's and {verb} it; it holds {}'s result",
                        guard_label(guard),
                        row.final_writer.as_deref().unwrap_or("nobody")
                    ),
                    broken: accepted,
                });
            }
            rows.push(row);
        }
        Ok(rows)
    }
}

/// The scenario's meaning, resource by resource, from the store's rows: A froze past its
/// validity, B was granted `granted` of `n` after, and what each guard made of A's write.
fn pause_meaning(
    rows: &[GuardedWrite],
    a_validity: i64,
    (granted, n): (usize, usize),
    granted_twice: Finding,
) -> Result<String> {
    let took = |row: &GuardedWrite| match row.stale.accepted {
        Some(true) => "took",
        Some(false) => "refused",
        None => "never saw",
    };
    let [unfenced, claim, late_claim, by_sequence] = rows else {
        bail!("four resources were written, {} read back", rows.len());
    };
    let token = |t: Option<i64>| t.map(|t| t.to_string()).unwrap_or("?".into());
    Ok(format!(
        "A froze past its {a_validity}ms validity; B was granted {granted} of {n} once A's key \
         expired everywhere: {}. A woke still believing it held the lock and wrote: a stale \
         writer. Unfenced, the store {} A's write. Claimed by value at the grant \
         (compare-and-set on the random value), it {} it: B's claim had replaced A's. \
         Claimed by value after the pause, it {} it: A's late claim displaced B's, and the \
         resource cannot tell which claim is older (a random value has no order). By the \
         sequence (token {} < {}) it {} it.",
        match granted_twice {
            Finding::No =>
                "B's round began after A's validity had ended, so the lock was \
                            never granted twice within validity",
            _ => "the lab's clock cannot order B's grant against the end of A's validity",
        },
        took(unfenced),
        took(claim),
        took(late_claim),
        token(by_sequence.stale.a_token),
        token(by_sequence.stale.b_token),
        took(by_sequence),
    ))
}

/// The scenario's faults: A stops itself where its script says (the nemesis adopts the
/// pause), and is resumed once B — granted after A's key expired on every master, which
/// the lab reads from each — has made its `writes` writes, one per guarded resource.
fn faults(writes: u32) -> Schedule {
    let on_a = |after: Anchor, fault: Fault| Step {
        at_ms: 0,
        after: Some(after),
        fault,
        target: "A".into(),
        duration_ms: None,
    };
    Schedule::new(vec![
        on_a(Anchor::on("A", Kind::Freezing, 1), Fault::Pause),
        on_a(Anchor::on("B", Kind::Wrote, writes), Fault::Resume),
    ])
}

//! Scenario 4: the client pauses past its validity. Redlock cannot help; a fencing token
//! from an ordered, durable source can, its random value cannot. A's pause and resume are
//! the scenario's schedule ([`faults`]).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::scene::{READ_TIMEOUT, Scene, name, round};
use super::verdict::{GuardedWrite, ScenarioVerdict, guard_label};
use crate::check::{self, Finding};
use crate::events::What;
use crate::events::facts::{Expired, StaleWrite, StaleWriteKind, Wrote};
use crate::events::{Event, Kind};
use crate::labs::faults::{Faults, Until};
use crate::lock::redlock::{self, Master};
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
        let script = RedlockClientScript {
            name: "A".into(),
            masters: (0..n).map(|i| (name(i), self.url(i))).collect(),
            key: key.clone(),
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
        let mut a = self.stage.spawn("A", &WorkerSpec::RedlockClient(script))?;
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
        // Until no master holds A's value: each expires it by its own clock.
        let deadline = Instant::now() + long;
        loop {
            let mut holding = 0;
            for i in 0..n {
                let mut master = Master::new(&name(i), &self.url(i));
                if let Ok((Some(value), _)) = master.read(&key, READ_TIMEOUT)
                    && value == a_value
                {
                    holding += 1;
                }
            }
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
            Expired {
                ..Expired::default()
            },
            format!("A's key has expired on all {n} masters, each by its own clock"),
        ));
        let mut b_lock = self.lock(&key);
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
        // B's round started after A's validity ended (proved on this process's clock), or
        // the lab cannot tell: it never says "granted twice" without the evidence.
        let granted_twice = check::redlock::granted_twice_after_pause(
            self.since_start(a_seen),
            a_validity,
            self.since_start(b_asked),
        );
        let b_token = store.next_token(sequence)?;
        for resource in [&resources.claimed, &resources.late_claim] {
            store.claim(&self.run_id, resource, "B", &b.value);
        }
        self.stage.record(Event::new(
            "B",
            What::Working,
            format!(
                "token {b_token} from the sequence; claims {} and {} with its value",
                resources.claimed, resources.late_claim
            ),
        ));
        for (resource, guard) in resources.guarded(&b.value, b_token) {
            let outcome = guard.write(&mut store, &self.run_id, resource, "B", "B's result");
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
        // B has written everything: the schedule's resume of A falls due now.
        let resumed = Until::done(long);
        self.stage
            .play(&mut faults, &mut self.nemesis, &mut [&mut a], resumed)?;
        self.stage
            .wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        a.finish(Duration::from_secs(5));
        self.release("B", &mut b_lock, &b);
        self.stage.drain();

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
                let (kind, verb): (StaleWriteKind, _) = if accepted {
                    (What::StaleWriteAccepted, "took")
                } else {
                    (What::StaleWriteRejected, "refused")
                };
                self.stage.record(Event::new(
                    "store",
                    kind(StaleWrite {
                        guard: Some(guard.into()),
                        ..StaleWrite::default()
                    }),
                    format!(
                        "{}: decided A's stale write after B's and {verb} it; it holds {}'s result",
                        guard_label(guard),
                        row.final_writer.as_deref().unwrap_or("nobody")
                    ),
                ));
            }
            rows.push(row);
        }
        let read = self.read_back(&key, "the masters at the end");
        let took = |row: &GuardedWrite| match row.stale.accepted {
            Some(true) => "took",
            Some(false) => "refused",
            None => "never saw",
        };
        let [unfenced, claim, late_claim, by_sequence] = &rows[..] else {
            bail!("four resources were written, {} read back", rows.len());
        };
        let token = |t: Option<i64>| t.map(|t| t.to_string()).unwrap_or("?".into());
        let stale_write = Some(unfenced.stale.clone());
        let meaning = format!(
            "A froze past its {a_validity}ms validity; B was granted {} of {n} once A's key \
             expired everywhere: {}. A woke still believing it held the lock and wrote: a stale \
             writer. Unfenced, the store {} A's write. Claimed by value at the grant \
             (compare-and-set on the random value), it {} it: B's claim had replaced A's. \
             Claimed by value after the pause, it {} it: A's late claim displaced B's, and the \
             resource cannot tell which claim is older (a random value has no order). By the \
             sequence (token {} < {}) it {} it.",
            b.granted,
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
        );
        Ok(ScenarioVerdict {
            name: "client-pause",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: granted_twice.as_option(),
            stale_write,
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

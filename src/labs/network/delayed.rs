//! One run of lab 8's delayed write: A takes the lock, checks it, sends its write; the
//! proxy on A's path to the store holds the write while A's lease runs out and B takes the
//! lock and writes; then the nemesis lifts the hold and A's write arrives.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;

use super::Plan;
use super::verdict::{RunVerdict, heard};
use crate::check::LateWrite;
use crate::connect::Backend;
use crate::events::facts::{self, FaultFacts, StaleWrite};
use crate::events::{Event, Kind, What};
use crate::labs::Stage;
use crate::labs::runner::Run;
use crate::nemesis::{Nemesis, Note};
use crate::procs;
use crate::proxy::{self, Direction, NetFault, Proxy};
use crate::store::{FenceRule, Store};
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec};

/// Plays the story once, fenced or not, and reads the verdict back.
pub(super) fn play(plan: &Plan, run: &Run, fenced: bool, store: &mut Store) -> Result<RunVerdict> {
    let run_id = run.id.as_str();
    let label = if fenced { "fenced" } else { "unfenced" };
    let mut stage = Stage::on_clock(run.style, run.started);
    stage.timeline.say("");
    stage.timeline.say(
        &if fenced {
            "── the delayed write, with fencing tokens ──"
                .green()
                .bold()
        } else {
            "── the delayed write, without fencing ──".red().bold()
        }
        .to_string(),
    );
    stage.tags().scenario = Some("delayed-write".into());
    stage.tags().fencing = Some(fenced);
    stage.checkpoint(crate::labs::step::network::before_run(fenced));

    let redis_url = run.url(Backend::Redis);
    let postgres_url = run.url(Backend::Postgres);
    let lock_key = format!("lockslab:{run_id}:network:delayed-write:{label}:lock");
    let resource = format!("network-delayed-write-{label}");
    // A's own path to the store: a fault on it touches A's bytes and nobody else's.
    let a_path = Proxy::start("A→store", proxy::upstream_of(postgres_url)?)?;
    let a_store_url = proxy::through(postgres_url, a_path.addr())?;
    stage.record(Event::new(
        "lab",
        facts::RunFacts {
            run_id: Some(run_id.into()),
            lock_key: Some(lock_key.clone()),
            ..facts::RunFacts::default()
        },
        format!(
            "run {run_id}: the lock is the Redis key {lock_key}; A reaches the store through the fault proxy on {}",
            a_path.addr()
        ),
    ));
    let role = |name: &str, store_url: &str, before_write, after_write| HolderScript {
        name: name.into(),
        lock: LockSpec::Redis {
            url: redis_url.into(),
            key: lock_key.clone(),
            ttl_ms: plan.ttl.as_millis() as u64,
            fence_counter: fenced.then(|| format!("lockslab:{run_id}:network:fence")),
            renew: false,
        },
        store_url: store_url.into(),
        run_id: run_id.into(),
        resource: resource.clone(),
        wait_ms: (plan.ttl * 3 + Duration::from_secs(10)).as_millis() as u64,
        before_write,
        after_write,
        fence_rule: FenceRule::NotLower,
        token_sequence: None,
    };

    let mut a = stage.spawn(
        "A",
        &WorkerSpec::Holder(role(
            "A",
            &a_store_url,
            BeforeWrite::WorkUntilToldThenCheck,
            AfterWrite::Release,
        )),
    )?;
    let mut nemesis = Nemesis::new();
    let start = Duration::from_secs(10);
    stage.wait_for(start, "A to take the lock", |e| e.is("A", Kind::Acquired))?;
    stage.wait_for(start, "A to start working", |e| e.is("A", Kind::Working))?;

    nemesis.net(
        &mut stage,
        &a_path,
        Direction::Up,
        NetFault::Hold,
        "the proxy on A→store holds what A sends next: A's write will leave A and wait in flight",
    );
    a.tell("finish")?;
    let checked = stage.wait_for(start, "A to check its lock", |e| e.is("A", Kind::Checked))?;
    if let What::Checked(check) = &checked.what
        && check.still_ours != Some(true)
    {
        bail!("A's lock had run out before A checked it: use a longer --ttl on a busy machine");
    }
    // B comes once A's write is on its way: it waits for A's key to expire.
    let mut b = stage.spawn(
        "B",
        &WorkerSpec::Holder(role(
            "B",
            postgres_url,
            BeforeWrite::Nothing,
            AfterWrite::HoldUntilTold,
        )),
    )?;

    // The write waits in the proxy until B has written. Meanwhile, look at A's process: it
    // must be running (or asleep in a read), never stopped — nobody paused it.
    let (mut looks, mut stopped) = (0u64, 0u64);
    let deadline = Instant::now() + plan.ttl * 3 + Duration::from_secs(15);
    while stage.saw("B", Kind::Wrote).is_none() {
        if Instant::now() > deadline {
            bail!(
                "B did not write within {:?} of A's check",
                deadline.elapsed()
            );
        }
        if let Some(event) = stage.next(Duration::from_millis(20))
            && event.kind() == Kind::Error
        {
            bail!("worker {} failed: {}", event.worker, event.text);
        }
        looks += 1;
        if procs::process_state(a.pid) == Some('T') {
            stopped += 1;
        }
    }
    let ran = looks > 0 && stopped == 0;
    let words = if ran {
        format!(
            "the proxy lets A's write go, after B wrote; A's process was never stopped in the {looks} looks the lab took at it"
        )
    } else {
        format!(
            "the proxy lets A's write go, after B wrote; A's process was stopped in {stopped} of {looks} looks"
        )
    };
    nemesis.heal_net(
        &mut stage,
        &a_path,
        Direction::Up,
        Note::new(
            words,
            FaultFacts {
                process_ran: Some(ran),
                ..FaultFacts::default()
            },
        ),
    );
    let long = plan.ttl + Duration::from_secs(15);
    stage.wait_for(long, "A's write to be answered", |e| e.is("A", Kind::Wrote))?;
    stage.wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
    b.tell("finish")?;
    stage.wait_for(long, "B to release", |e| e.is("B", Kind::Released))?;
    a.finish(Duration::from_secs(5));
    b.finish(Duration::from_secs(5));
    stage.drain();
    drop(a_path);

    let heard = heard(&stage.log)?;
    let read = store.read_back(run_id, &resource)?;
    let verdict = RunVerdict::judge(fenced, &heard, read)?;
    let holds = verdict.final_writer.clone().unwrap_or("nobody".into());
    let line = match verdict.late_write {
        LateWrite::Accepted => Some((
            What::StaleWriteAccepted as fn(StaleWrite) -> What,
            format!(
                "decided A's late write after B's and took it: it holds {holds}'s result, B's is lost"
            ),
        )),
        LateWrite::Rejected => Some((
            What::StaleWriteRejected as fn(StaleWrite) -> What,
            format!(
                "decided A's late write after B's and refused its lower token: it holds {holds}'s result"
            ),
        )),
        LateWrite::None => None,
    };
    if let Some((kind, text)) = line {
        let facts = StaleWrite {
            final_writer: Some(holds),
            resource: Some(resource.clone()),
            ..StaleWrite::default()
        };
        stage.record(Event::new("store", kind(facts), text));
    }
    Ok(verdict)
}

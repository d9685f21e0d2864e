//! Scenario 2: a master restarting empty hands the lock out twice; kept down longer than
//! the TTL, it does not. Each part is a schedule ([`super::schedules`]): the masters A does
//! not get are down during its round; right after it they come back, and one of A's
//! crashes — restarting at once, or (delayed) only once the TTL has run out.

use std::time::Duration;

use anyhow::Result;

use super::scene::{Scene, name, round};
use super::schedules::{after_a, at_start};
use super::verdict::ScenarioVerdict;
use crate::check::redlock as check;
use crate::nemesis::Fault;
use crate::nemesis::schedule::Schedule;
use crate::output::human;

impl Scene {
    /// Scenario 2: a master restarting empty hands out the lock twice; kept down longer
    /// than the TTL, it does not.
    pub(super) fn play_restart(&mut self) -> Result<Vec<ScenarioVerdict>> {
        let q = self.q();
        self.heading(
            "restart",
            &format!("2. A master restarts empty: A holds {}", self.names(0..q)),
        );
        let empty = self.restart_empty()?;
        self.note(&format!(
            "again, but a crashed master stays down longer than the TTL ({}) before it rejoins",
            human(self.settings.ttl)
        ));
        let delayed = self.restart_delayed()?;
        Ok(vec![empty, delayed])
    }

    /// A gets the first q masters (the others are down while it asks); then the others
    /// come back and one of A's crashes and restarts empty; B asks.
    fn restart_empty(&mut self) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        let others: Vec<usize> = (q..n).collect();
        let crashing = q - 1;
        let schedule = Schedule::new(
            [
                at_start(Fault::Kill, &others),
                after_a(Fault::Restart, &others, 0),
                after_a(Fault::Restart, &[crashing], 0),
            ]
            .concat(),
        );
        let mut faults = self.faults(&schedule);
        self.play_until(&mut faults, Fault::Kill, &others)?;
        let key = self.key("restart-empty");
        let mut a_lock = self.lock(&key);
        let a = self.acquire("A", &mut a_lock);
        self.play_until(&mut faults, Fault::Restart, &[crashing])?;
        let (mut b_lock, b, read, two) = self.b_asks(&key, &a);
        if a.held {
            self.release("A", &mut a_lock, &a);
        }
        if b.held {
            self.release("B", &mut b_lock, &b);
        }
        Ok(ScenarioVerdict {
            name: "restart-empty",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            meaning: format!(
                "A was granted by {} of {n}. {} came back empty and, with {}, granted B {} of \
                 {n}: {}",
                a.granted,
                name(crashing),
                self.names(others.clone()),
                b.granted,
                if two {
                    "two holders at once, while A's validity still ran. No client paused."
                } else {
                    "B was not granted while A's validity ran."
                }
            ),
            rounds: vec![round("A", &a), round("B", &b)],
            read_back: read,
            prevented_by: "a master that keeps its keys across the crash — for this SIGKILL, \
                           appendonly yes with the default appendfsync everysec (an acknowledged \
                           SET has reached the page cache); for a power loss, appendfsync \
                           always — or one that stays down longer than the longest TTL",
            schedule: Some(schedule),
            ..Default::default()
        })
    }

    /// The same, but the crashed master is started again only longer than the TTL after
    /// A's round — the delay the algorithm's author proposes — so every key A's round set
    /// has expired by then.
    fn restart_delayed(&mut self) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        let others: Vec<usize> = (q..n).collect();
        let crashing = q - 1;
        let delay = self.settings.ttl + Duration::from_millis(200);
        let schedule = Schedule::new(
            [
                at_start(Fault::Kill, &others),
                // It crashes first, so that it stays down for all of the delay.
                after_a(Fault::Kill, &[crashing], 0),
                after_a(Fault::Restart, &others, 0),
                after_a(Fault::Restart, &[crashing], delay.as_millis() as u64),
            ]
            .concat(),
        );
        let mut faults = self.faults(&schedule);
        self.play_until(&mut faults, Fault::Kill, &others)?;
        let key = self.key("restart-delayed");
        let mut a_lock = self.lock(&key);
        let a = self.acquire("A", &mut a_lock);
        self.play_until(&mut faults, Fault::Restart, &others)?;
        let (_, b, read, two) = self.b_asks(&key, &a);
        self.play_until(&mut faults, Fault::Restart, &[crashing])?;
        let rejoined = self.read_back(&key, "the masters once it has rejoined");
        let a_keys_left = check::held_by(&rejoined, "A");
        if a.held {
            self.release("A", &mut a_lock, &a);
        }
        // How long it was down, by the history: from its kill to its return.
        let down = self.down_for(&name(crashing)).unwrap_or(delay);
        Ok(ScenarioVerdict {
            name: "restart-delayed",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            meaning: format!(
                "With {} kept down for {}, B got {} of {n}: {}. {}",
                name(crashing),
                human(down),
                b.granted,
                if b.held { "granted" } else { "refused" },
                if a_keys_left == 0 {
                    "When it rejoined, no master held A's key any more: an empty master could \
                     no longer hand the lock out twice."
                        .to_string()
                } else {
                    format!("When it rejoined, {a_keys_left} master(s) still held A's key.")
                }
            ),
            rounds: vec![round("A", &a), round("B", &b)],
            read_back: read,
            prevented_by: "this is the prevention (a delayed restart); it costs availability",
            schedule: Some(schedule),
            ..Default::default()
        })
    }
}

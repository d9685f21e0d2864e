//! Scenario 2: a master restarting empty hands the lock out twice; kept down longer than
//! the TTL, it does not.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::scene::{Scene, name, round};
use super::verdict::ScenarioVerdict;
use crate::check::redlock as check;
use crate::output::human;

impl Scene {
    /// Scenario 2: a master restarting empty hands out the lock twice; kept down longer
    /// than the TTL, it does not.
    pub(super) fn play_restart(&mut self) -> Result<Vec<ScenarioVerdict>> {
        // Played by hand, not as a schedule (labs::faults): A and B are the lab's own calls,
        // in this process, and each fault comes between two of them (after A's round
        // returns, before B asks): an order, not a time or a worker's event.
        let (n, q) = (self.n(), self.q());
        // A gets the first q masters: the others are down while A asks.
        let others: Vec<usize> = (q..n).collect();
        let crashing = q - 1;
        self.heading(
            "restart",
            &format!("2. A master restarts empty: A holds {}", self.names(0..q)),
        );
        let mut verdicts = Vec::new();

        for &i in &others {
            self.kill(i)?;
        }
        let key = self.key("restart-empty");
        let mut a_lock = self.lock(&key);
        let a = self.acquire("A", &mut a_lock);
        for &i in &others {
            self.restart(i)?;
        }
        self.crash(crashing)?;
        let (mut b_lock, b, read, two) = self.b_asks(&key, &a);
        if a.held {
            self.release("A", &mut a_lock, &a);
        }
        if b.held {
            self.release("B", &mut b_lock, &b);
        }
        verdicts.push(ScenarioVerdict {
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
            ..Default::default()
        });

        self.note(&format!(
            "again, but a crashed master stays down longer than the TTL ({}) before it rejoins",
            human(self.settings.ttl)
        ));
        for &i in &others {
            self.kill(i)?;
        }
        let key = self.key("restart-delayed");
        let mut a_lock = self.lock(&key);
        let a = self.acquire("A", &mut a_lock);
        for &i in &others {
            self.restart(i)?;
        }
        self.kill(crashing)?;
        let crashed_at = Instant::now();
        let (_, b, read, two) = self.b_asks(&key, &a);
        // The delay the algorithm's author proposes: longer than the longest TTL.
        let delay = self.settings.ttl + Duration::from_millis(200);
        if let Some(left) = (crashed_at + delay).checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        self.restart(crashing)?;
        let rejoined = self.read_back(&key, "the masters once it has rejoined");
        let a_keys_left = check::held_by(&rejoined, "A");
        if a.held {
            self.release("A", &mut a_lock, &a);
        }
        verdicts.push(ScenarioVerdict {
            name: "restart-delayed",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            meaning: format!(
                "With {} kept down for {}, B got {} of {n}: {}. {}",
                name(crashing),
                human(delay),
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
            ..Default::default()
        });
        Ok(verdicts)
    }
}

//! Scenario 1: a minority of masters down, then frozen, then a majority down.

use anyhow::Result;

use super::scene::{Scene, name, round};
use super::verdict::ScenarioVerdict;
use crate::check::Finding;
use crate::check::redlock as check;
use crate::output::human;

impl Scene {
    /// Scenario 1: a minority down, a minority frozen, a majority down.
    pub(super) fn play_minority(&mut self) -> Result<Vec<ScenarioVerdict>> {
        let (n, q) = (self.n(), self.q());
        // The last n − q masters are the minority; one more makes a majority down.
        let minority: Vec<usize> = (q..n).collect();
        self.heading(
            "minority",
            &format!("1. Survives a minority: {} of {n} masters down", n - q),
        );
        let mut verdicts = Vec::new();

        for &i in &minority {
            self.kill(i)?;
        }
        let key = self.key("minority-down");
        let mut lock = self.lock(&key);
        let down = self.acquire("A", &mut lock);
        let down_read = self.read_back(&key, "the masters, right after A's round");
        if down.held {
            self.release("A", &mut lock, &down);
        }
        for &i in &minority {
            self.restart(i)?;
        }
        verdicts.push(ScenarioVerdict {
            name: "minority-down",
            granted: down.held,
            quorum: q,
            validity_ms: down.validity_ms,
            meaning: format!(
                "With {} down (connection refused at once), {} of {n} granted: {}.",
                self.names(minority.clone()),
                down.granted,
                if down.held {
                    "the lock holds, and the dead masters cost almost no validity"
                } else {
                    "not held"
                }
            ),
            rounds: vec![round("A", &down)],
            read_back: down_read,
            prevented_by: "nothing needed: a minority down is what Redlock is built for",
            ..Default::default()
        });

        self.note(&format!(
            "{} frozen instead: each costs the {} per-instance timeout",
            self.names(minority.clone()),
            human(self.settings.instance_timeout)
        ));
        for &i in &minority {
            self.freeze(i)?;
        }
        let key = self.key("minority-frozen");
        let mut lock = self.lock(&key);
        let frozen = self.acquire("A", &mut lock);
        let frozen_read = self.read_back(&key, "the masters, right after A's round");
        if frozen.held {
            self.release("A", &mut lock, &frozen);
        }
        // The share of the round spent waiting on the frozen masters, from the same round.
        let waited = check::waited_on_silent_ms(&frozen.answers);
        verdicts.push(ScenarioVerdict {
            name: "minority-frozen",
            granted: frozen.held,
            quorum: q,
            validity_ms: frozen.validity_ms,
            meaning: format!(
                "With {} frozen, {} of {n} granted ({}). Of the round's {}ms, {waited:.0}ms \
                 went on waiting for the frozen masters: validity {}ms.",
                self.names(minority.clone()),
                frozen.granted,
                if frozen.held { "held" } else { "not held" },
                frozen.elapsed_whole_ms(),
                frozen.validity_ms
            ),
            rounds: vec![round("A", &frozen)],
            read_back: frozen_read,
            prevented_by: "nothing needed; a shorter per-instance timeout costs less validity",
            ..Default::default()
        });

        // One more master down: only a minority can answer.
        let extra = q - 1;
        self.kill(extra)?;
        let key = self.key("majority-down");
        let mut lock = self.lock(&key);
        let failed = self.acquire("A", &mut lock);
        let after = self.read_back(&key, "the masters, after the failed round's release");
        let left = check::holding(&after);
        for &i in &minority {
            self.thaw(i)?;
        }
        self.restart(extra)?;
        // What the frozen masters did with the requests queued while they were stopped.
        let woke = self.read_back(&key, "the same key once the frozen masters woke");
        let set_once_thawed = check::holding(&woke);
        let late: Vec<String> = woke
            .iter()
            .filter(|s| set_once_thawed.contains(&s.master))
            .map(|s| format!("{} ({}ms left)", s.master, s.pttl_ms.unwrap_or_default()))
            .collect();
        let silent: Vec<&str> = woke
            .iter()
            .filter(|s| !s.answered)
            .map(|s| s.master.as_str())
            .collect();
        let answering: Vec<usize> = (0..n)
            .filter(|i| *i != extra && !minority.contains(i))
            .collect();
        verdicts.push(ScenarioVerdict {
            name: "majority-down",
            granted: failed.held,
            quorum: q,
            validity_ms: failed.validity_ms,
            meaning: format!(
                "With {} down and {} frozen, {} of {n} granted: {}. Right after the release on \
                 all {n}, {}.{}",
                name(extra),
                self.names(minority.clone()),
                failed.granted,
                if failed.held { "held" } else { "not held, and the release was sent to every master" },
                if left.is_empty() {
                    format!("no master that answered ({}) kept its key", self.names(answering))
                } else {
                    format!("{} still held it", left.join(", "))
                },
                match check::released_everywhere(&woke) {
                    Finding::Yes =>
                        " Once thawed, no master held it either: released everywhere.".to_string(),
                    Finding::No => format!(
                        " Once thawed, {} set the key after all (a request that timed out still \
                         landed), so it was not released everywhere: only its TTL removes it.",
                        late.join(", ")
                    ),
                    Finding::Unknown => format!(
                        " Once thawed, {} did not answer the read-back: whether the key was \
                         released everywhere is unknown.",
                        silent.join(", ")
                    ),
                }
            ),
            left_after_release: Some(left),
            set_once_thawed: Some(set_once_thawed),
            rounds: vec![round("A", &failed)],
            read_back: after,
            prevented_by: "nothing to prevent: no majority, no lock (availability lost, not safety)",
            ..Default::default()
        });
        Ok(verdicts)
    }
}

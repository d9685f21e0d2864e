//! Scenario 1: a minority of masters down, then frozen, then a majority down. Each part is
//! a schedule ([`super::schedules`]): the minority killed and brought back after A's round;
//! frozen; one more killed, the frozen ones thawed and it brought back after A's round.

use anyhow::Result;

use super::scene::{Scene, name, round};
use super::schedules::{after_a, at_start};
use super::verdict::ScenarioVerdict;
use crate::check::Finding;
use crate::check::redlock::{self as check, MasterState};
use crate::lock::redlock::Attempt;
use crate::lock::redlock::Reply;
use crate::nemesis::Fault;
use crate::nemesis::schedule::Schedule;
use crate::output::human;

/// How many rounds A makes at most in a part where a master the lab left alone may miss
/// the per-instance timeout on a busy machine.
const ROUNDS_AT_MOST: usize = 3;
/// How long A waits before it tries again (a fixed delay: the lab's runs replay alike).
const RETRY_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// The masters of `attempt` that gave no answer in time although the lab did nothing to
/// them: not a fault of the part, the machine's load.
fn missed_untouched(attempt: &Attempt, touched: &[usize]) -> Vec<String> {
    let touched: Vec<String> = touched.iter().map(|&i| name(i)).collect();
    (attempt.answers.iter())
        .filter(|a| matches!(a.reply, Reply::NoAnswer { .. }) && !touched.contains(&a.master))
        .map(|a| a.master.clone())
        .collect()
}

/// What the part's sentence adds when A needed more than one round, or never got a clean
/// one: which live masters missed the timeout, and that this is the machine, not Redlock.
fn busy_sentence(rounds: &[Attempt], touched: &[usize]) -> String {
    let last = rounds.last().expect("at least one round");
    let missed = missed_untouched(last, touched);
    if !missed.is_empty() {
        return format!(
            " Not the lesson: {} — which the lab left alone — missed the per-instance \
             timeout in each of A's {} rounds; this machine is too busy for this part (run \
             it again when it is quieter, or with a longer --instance-timeout).",
            missed.join(", "),
            rounds.len()
        );
    }
    if rounds.len() > 1 {
        return format!(
            " It took A {} rounds: a master the lab left alone missed the per-instance \
             timeout before (a busy machine), and A tried again.",
            rounds.len()
        );
    }
    String::new()
}

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
        let down = self.minority_down(&minority)?;
        self.note(&format!(
            "{} frozen instead: each costs the {} per-instance timeout",
            self.names(minority.clone()),
            human(self.settings.instance_timeout)
        ));
        let frozen = self.minority_frozen(&minority)?;
        let majority = self.majority_down(&minority)?;
        Ok(vec![down, frozen, majority])
    }

    /// A's round on the part's own key, the masters read back right after it, and its
    /// release if it held. A round that missed a master the lab left alone (`touched` are
    /// the ones it killed or froze) is tried again, as a Redlock client retries after a
    /// failed round, up to [`ROUNDS_AT_MOST`]: on a busy machine a live master can miss the
    /// per-instance timeout, and one such round says nothing about a minority being down.
    /// Every round is returned, the last one deciding.
    fn a_round(&mut self, part: &str, touched: &[usize]) -> (Vec<Attempt>, Vec<MasterState>) {
        let key = self.key(part);
        let mut lock = self.lock(&key);
        let mut rounds = Vec::new();
        loop {
            let attempt = self.acquire("A", &mut lock);
            let busy = missed_untouched(&attempt, touched);
            rounds.push(attempt);
            if busy.is_empty() || rounds.len() >= ROUNDS_AT_MOST {
                break;
            }
            self.note(&format!(
                "{} did not answer within the per-instance timeout, though the lab left {} \
                 alone: this machine is busy. A tries again in {}, as a Redlock client does",
                busy.join(", "),
                if busy.len() == 1 { "it" } else { "them" },
                human(RETRY_AFTER)
            ));
            std::thread::sleep(RETRY_AFTER);
        }
        let read = self.read_back(&key, "the masters, right after A's round");
        let last = rounds.last().expect("at least one round");
        if last.held {
            let last = last.clone();
            self.release("A", &mut lock, &last);
        }
        (rounds, read)
    }

    /// The minority killed: connection refused at once, so they cost no validity.
    fn minority_down(&mut self, minority: &[usize]) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        let schedule = Schedule::new(
            [
                at_start(Fault::Kill, minority),
                after_a(Fault::Restart, minority, 0),
            ]
            .concat(),
        );
        let mut faults = self.faults(&schedule);
        self.play_until(&mut faults, Fault::Kill, minority)?;
        let (rounds, read) = self.a_round("minority-down", minority);
        let down = rounds.last().expect("at least one round").clone();
        self.play_until(&mut faults, Fault::Restart, minority)?;
        Ok(ScenarioVerdict {
            name: "minority-down",
            granted: down.held,
            quorum: q,
            validity_ms: down.validity_ms,
            meaning: format!(
                "With {} down (connection refused at once), {} of {n} granted: {}.{}",
                self.names(minority.to_vec()),
                down.granted,
                if down.held {
                    "the lock holds, and the dead masters cost almost no validity"
                } else {
                    "not held"
                },
                busy_sentence(&rounds, minority)
            ),
            rounds: rounds.iter().map(|r| round("A", r)).collect(),
            read_back: read,
            prevented_by: "nothing needed: a minority down is what Redlock is built for",
            schedule: Some(schedule),
            ..Default::default()
        })
    }

    /// The minority frozen: each costs the whole per-instance timeout. They stay frozen
    /// into the next part.
    fn minority_frozen(&mut self, minority: &[usize]) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        let schedule = Schedule::new(at_start(Fault::Pause, minority));
        let mut faults = self.faults(&schedule);
        self.play_until(&mut faults, Fault::Pause, minority)?;
        let (rounds, read) = self.a_round("minority-frozen", minority);
        let frozen = rounds.last().expect("at least one round").clone();
        // The share of the round spent waiting on the frozen masters, from the same round.
        let waited = check::waited_on_silent_ms(&frozen.answers);
        Ok(ScenarioVerdict {
            name: "minority-frozen",
            granted: frozen.held,
            quorum: q,
            validity_ms: frozen.validity_ms,
            meaning: format!(
                "With {} frozen, {} of {n} granted ({}). Of the round's {}ms, {waited:.0}ms \
                 went on waiting for the frozen masters: validity {}ms.{}",
                self.names(minority.to_vec()),
                frozen.granted,
                if frozen.held { "held" } else { "not held" },
                frozen.elapsed_whole_ms(),
                frozen.validity_ms,
                busy_sentence(&rounds, minority)
            ),
            rounds: rounds.iter().map(|r| round("A", r)).collect(),
            read_back: read,
            prevented_by: "nothing needed; a shorter per-instance timeout costs less validity",
            schedule: Some(schedule),
            ..Default::default()
        })
    }

    /// One more master down besides the frozen minority: only a minority can answer. Then
    /// the frozen ones are thawed, and the key read back again: a request that timed out
    /// may still have landed.
    fn majority_down(&mut self, minority: &[usize]) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        let extra = q - 1;
        let schedule = Schedule::new(
            [
                at_start(Fault::Kill, &[extra]),
                after_a(Fault::Resume, minority, 0),
                after_a(Fault::Restart, &[extra], 0),
            ]
            .concat(),
        );
        let mut faults = self.faults(&schedule);
        self.play_until(&mut faults, Fault::Kill, &[extra])?;
        let key = self.key("majority-down");
        let mut lock = self.lock(&key);
        let failed = self.acquire("A", &mut lock);
        let after = self.read_back(&key, "the masters, after the failed round's release");
        let left = check::holding(&after);
        self.play_until(&mut faults, Fault::Restart, &[extra])?;
        // What the frozen masters did with the requests queued while they were stopped.
        let woke = self.read_back(&key, "the same key once the frozen masters woke");
        let set_once_thawed = check::holding(&woke);
        let answering: Vec<usize> = (0..n)
            .filter(|i| *i != extra && !minority.contains(i))
            .collect();
        let meaning = format!(
            "With {} down and {} frozen, {} of {n} granted: {}. Right after the release on \
             all {n}, {}.{}",
            name(extra),
            self.names(minority.to_vec()),
            failed.granted,
            if failed.held {
                "held"
            } else {
                "not held, and the release was sent to every master"
            },
            if left.is_empty() {
                format!(
                    "no master that answered ({}) kept its key",
                    self.names(answering)
                )
            } else {
                format!("{} still held it", left.join(", "))
            },
            once_thawed(&woke, &set_once_thawed)
        );
        Ok(ScenarioVerdict {
            name: "majority-down",
            granted: failed.held,
            quorum: q,
            validity_ms: failed.validity_ms,
            meaning,
            left_after_release: Some(left),
            set_once_thawed: Some(set_once_thawed),
            rounds: vec![round("A", &failed)],
            read_back: after,
            prevented_by: "nothing to prevent: no majority, no lock (availability lost, not safety)",
            schedule: Some(schedule),
            ..Default::default()
        })
    }
}

/// What the masters held once the frozen ones woke: released everywhere, or set after all
/// by a request that timed out and still landed, or unknown where one did not answer.
fn once_thawed(woke: &[MasterState], set_once_thawed: &[String]) -> String {
    match check::released_everywhere(woke) {
        Finding::Yes => " Once thawed, no master held it either: released everywhere.".into(),
        Finding::No => {
            let late: Vec<String> = (woke.iter())
                .filter(|s| set_once_thawed.contains(&s.master))
                .map(|s| format!("{} ({}ms left)", s.master, s.pttl_ms.unwrap_or_default()))
                .collect();
            format!(
                " Once thawed, {} set the key after all (a request that timed out still \
                 landed), so it was not released everywhere: only its TTL removes it.",
                late.join(", ")
            )
        }
        Finding::Unknown => {
            let silent: Vec<&str> = (woke.iter())
                .filter(|s| !s.answered)
                .map(|s| s.master.as_str())
                .collect();
            format!(
                " Once thawed, {} did not answer the read-back: whether the key was \
                 released everywhere is unknown.",
                silent.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::redlock::Answer;

    fn attempt(replies: [Reply; 5]) -> Attempt {
        let answers: Vec<Answer> = (replies.into_iter().enumerate())
            .map(|(i, reply)| Answer {
                master: name(i),
                port: format!("{}", 7000 + i),
                reply,
                sent_ms: 0.0,
                took_ms: 50.0,
            })
            .collect();
        let granted = answers.iter().filter(|a| a.reply == Reply::Granted).count();
        Attempt {
            value: "v".into(),
            answers,
            granted,
            quorum: 3,
            ttl_ms: 2000,
            elapsed_ms: 150.0,
            drift_ms: 22,
            validity_ms: 1828,
            held: granted >= 3,
            released: Vec::new(),
            started: None,
        }
    }

    fn late() -> Reply {
        Reply::NoAnswer {
            why: "no answer in time".into(),
        }
    }

    #[test]
    fn a_live_master_that_missed_the_timeout_is_the_machine_not_the_part() {
        let minority = [3, 4];
        let busy = attempt([late(), Reply::Granted, Reply::Granted, late(), late()]);
        assert_eq!(missed_untouched(&busy, &minority), ["m1"]);
        let clean = attempt([
            Reply::Granted,
            Reply::Granted,
            Reply::Granted,
            late(),
            late(),
        ]);
        assert!(missed_untouched(&clean, &minority).is_empty());
        // Held at the second round: said, not hidden.
        assert!(busy_sentence(&[busy.clone(), clean.clone()], &minority).contains("2 rounds"));
        // Never a clean round: the part says it is not the lesson.
        let never = busy_sentence(&[busy.clone(), busy.clone(), busy], &minority);
        assert!(never.contains("Not the lesson: m1"), "{never}");
        assert!(busy_sentence(&[clean], &minority).is_empty());
    }
}

//! Scenario 3: clocks jumping forward on some masters (SIMULATED with PEXPIRE), the key
//! expiring early there, and B getting a majority.

use std::time::Duration;

use anyhow::Result;

use super::scene::{READ_TIMEOUT, Scene, name, round};
use super::schedules::{after_a, at_start};
use super::verdict::ScenarioVerdict;
use crate::events::Event;
use crate::events::facts::Expired;
use crate::lock::redlock::Master;
use crate::nemesis::Fault;
use crate::nemesis::schedule::Schedule;
use crate::output::human;

impl Scene {
    /// Scenario 3: clocks jumping forward on some masters (simulated), the key expiring
    /// early there, and B getting a majority.
    pub(super) fn play_clock_jump(&mut self) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        let last = n - 1;
        // A gets every master but the last; q − 1 of A's then lose the key early, which
        // leaves A a minority and gives B those q − 1 plus the last: a majority.
        let jumping: Vec<usize> = (n - q..last).collect();
        self.heading(
            "clock-jump",
            &format!(
                "3. A clock jumps forward on {} (SIMULATED)",
                self.names(jumping.clone())
            ),
        );
        let key = self.key("clock-jump");
        // Its one fault, on masters of the lab's own: the last is down during A's round
        // and back right after it. On the user's masters a key of the lab's stands in.
        let schedule = (!self.private.is_empty()).then(|| {
            Schedule::new(
                [
                    at_start(Fault::Kill, &[last]),
                    after_a(Fault::Restart, &[last], 0),
                ]
                .concat(),
            )
        });
        let mut faults = schedule.as_ref().map(|schedule| self.faults(schedule));
        match &mut faults {
            Some(faults) => self.play_until(faults, Fault::Kill, &[last])?,
            None => self.stand_in(last, &key)?,
        }
        let mut a_lock = self.lock(&key);
        let a = self.acquire("A", &mut a_lock);
        match &mut faults {
            Some(faults) => self.play_until(faults, Fault::Restart, &[last])?,
            None => self.stand_in_gone(last, &key)?,
        }
        let jump = self.settings.ttl;
        for &i in &jumping {
            self.simulate_jump(i, &key, jump)?;
        }
        let (mut b_lock, b, read, two) = self.b_asks(&key, &a);
        if a.held {
            self.release("A", &mut a_lock, &a);
        }
        if b.held {
            self.release("B", &mut b_lock, &b);
        }
        Ok(ScenarioVerdict {
            name: "clock-jump",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            meaning: format!(
                "A was granted by {} of {n}. The (simulated) {} jump on {} expired A's key \
                 there early; B then got {} of {n}: {}",
                a.granted,
                human(jump),
                self.names(jumping.clone()),
                b.granted,
                if two {
                    "two holders at once, while A's validity still ran on A's own clock."
                } else {
                    "B was not granted while A's validity ran."
                }
            ),
            rounds: vec![round("A", &a), round("B", &b)],
            read_back: read,
            simulated: Some(
                "the clock jump: the key's PTTL was shortened by the jump with PEXPIRE on the \
                 jumping masters (redis-server crashes under libfaketime); everything else is real",
            ),
            schedule,
            prevented_by: "masters whose clocks never step and slew no faster than the drift \
                           allowance (chrony's default slew reaches 8.3%): the timing \
                           assumption Redlock rests on",
            ..Default::default()
        })
    }

    /// On a master of the user's, which the lab never kills: the lab takes the key there
    /// first, so the master refuses A's round (as a down one would not grant it).
    fn stand_in(&mut self, i: usize, key: &str) -> Result<()> {
        let value = format!("lockslab-stand-in-{}", self.run_id);
        let mut master = Master::new(&name(i), &self.url(i));
        let _: Option<String> = master
            .command(
                redis::cmd("SET")
                    .arg(key)
                    .arg(&value)
                    .arg("PX")
                    .arg(self.settings.ttl.as_millis() as u64),
                READ_TIMEOUT,
            )
            .map_err(|why| anyhow::anyhow!("Redis master {} did not answer SET: {why}", name(i)))?;
        self.values.push((value, "lab".into()));
        self.note(&format!(
            "{} is yours, not the lab's to kill: the lab sets the key there first, so it \
             refuses A",
            name(i)
        ));
        Ok(())
    }

    fn stand_in_gone(&mut self, i: usize, key: &str) -> Result<()> {
        let mut master = Master::new(&name(i), &self.url(i));
        let _: i64 = master
            .command(redis::cmd("DEL").arg(key), READ_TIMEOUT)
            .map_err(|why| anyhow::anyhow!("Redis master {} did not answer DEL: {why}", name(i)))?;
        self.note(&format!(
            "deletes its stand-in key on {}: it answers for itself again",
            name(i)
        ));
        Ok(())
    }

    /// What a forward jump of a master's clock does to a key's expiry, done to the key:
    /// PTTL shortened by `jump` (a key with less left than that expires at once).
    fn simulate_jump(&mut self, i: usize, key: &str, jump: Duration) -> Result<()> {
        let mut master = Master::new(&name(i), &self.url(i));
        let before: i64 = master
            .command(redis::cmd("PTTL").arg(key), READ_TIMEOUT)
            .map_err(|why| {
                anyhow::anyhow!("Redis master {} did not answer PTTL: {why}", name(i))
            })?;
        let after = before - jump.as_millis() as i64;
        // PEXPIRE with zero or less deletes the key, as an expiry in the past would.
        let _: i64 = master
            .command(
                redis::cmd("PEXPIRE").arg(key).arg(after.max(0)),
                READ_TIMEOUT,
            )
            .map_err(|why| {
                anyhow::anyhow!("Redis master {} did not answer PEXPIRE: {why}", name(i))
            })?;
        let (_, now) = master
            .read(key, READ_TIMEOUT)
            .map_err(|why| anyhow::anyhow!("Redis master {} did not answer: {why}", name(i)))?;
        self.stage.record(Event::new(
            "masters",
            Expired {
                lock: Some(key.to_string()),
                master: Some(name(i)),
                simulated: Some(true),
                jump_ms: Some(jump.as_millis() as u64),
                pttl_before_ms: Some(before),
                pttl_after_ms: Some(now),
            },
            format!(
                "SIMULATED: {}'s clock jumps {} ahead → PEXPIRE: PTTL {before}ms → {}",
                name(i),
                human(jump),
                if now == -2 {
                    "key expired".to_string()
                } else {
                    format!("{now}ms")
                }
            ),
        ));
        Ok(())
    }
}

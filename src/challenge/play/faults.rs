//! The challenge's faults, played on its clients by the nemesis's one player
//! ([`Faults`]): the schedule drawn from the seed, and each action when it falls due (a
//! pause or a delay is aimed at the write: see `aim`). The run takes what falls due and
//! has the player do it at the moment it aims at, in its words; a fault whose moment only
//! the run sees (the worst order, the failover) is a step added to the schedule then.

use super::*;
use crate::events::Kind;
use crate::nemesis::play::Cue;
use crate::nemesis::schedule::{Due, How};
use crate::nemesis::{Note, Victim};

impl Run<'_> {
    pub(super) fn play_due(&mut self) -> Result<()> {
        self.hear_proxies()?;
        self.rearm_at_new_notes();
        let due = match self.faults.as_mut() {
            Some(faults) => faults.take_due(&mut self.tape),
            None => Vec::new(),
        };
        // The challenge's schedule has faults only (no probes, no step that gives up).
        let due = due.into_iter().filter_map(|due| match due {
            Due::Fault(action) => Some(action),
            _ => None,
        });
        for action in due {
            // A pause whose client's lock still stands ends when that lock is gone.
            if action.fault == Fault::Resume && self.resume_when_lock_gone(&action) {
                continue;
            }
            if self.one_fault_at_a_time(&action) || self.natural_order_alone(&action) {
                continue;
            }
            self.act(&action)?;
        }
        self.let_frozen_writes_go();
        Ok(())
    }

    /// `pause`, `delay`: a fault falling due while another client's is armed or playing
    /// waits for that one to end, then for its client's next note of the kind its step is
    /// anchored on (its `writing`), so that it is still aimed at a write after a read.
    ///
    /// A held write tests the lock only if another client comes for its record meanwhile.
    /// Two faults at once leave one client of three free, and under a lock that holds
    /// others off (`FOR UPDATE`, an advisory lock) that one waits behind the first frozen
    /// client the whole time: the second fault could never bite, and the run ended unknown
    /// on about one seed in five.
    fn one_fault_at_a_time(&mut self, action: &Action) -> bool {
        if !matches!(action.fault, Fault::Pause | Fault::Delay) {
            return false;
        }
        let Some(other) = self.other_fault_on(&action.target) else {
            return false;
        };
        let Some(faults) = self.faults.as_mut() else {
            return false;
        };
        let resume = faults.withdraw(&action.target, Fault::Resume);
        let what = if action.fault == Fault::Pause {
            "pause"
        } else {
            "delay"
        };
        let text = format!(
            "{}'s {what} waits until {other}'s fault ends (one at a time)",
            action.target
        );
        self.postpone(action, resume, text);
        true
    }

    /// `action` waits for its client's next note of the kind its step is anchored on
    /// ([`Run::rearm_postponed`]), with its pause's `resume`; the timeline says why.
    fn postpone(&mut self, action: &Action, resume: Option<Action>, why: String) {
        let event = crate::events::Event::new(crate::nemesis::LANE, What::Output, why);
        self.tape.record(event);
        let postponed = Postponed {
            action: action.clone(),
            resume,
        };
        self.postponed.insert(action.target.clone(), postponed);
    }

    /// A fault dealt the natural order ([`How::newer_first`]) waits for a job of its
    /// client's that no other client has a job on the record of — then, while it waits for
    /// the write, no job on that record goes to another client ([`Run::kept_for_the_natural_order`]),
    /// and one goes first once the write is held: the newer holder comes only after the
    /// faulted client wrote (or decided how to). A client careful only while another has
    /// a job on its record — a compare-and-set then, a blind write when alone — writes
    /// blind, and its stale write lands last. It waits at most [`NATURAL_WAITS`] of its
    /// client's notes, then plays where it is; true when it waits.
    fn natural_order_alone(&mut self, action: &Action) -> bool {
        if !matches!(action.fault, Fault::Pause | Fault::Delay) {
            return false;
        }
        let natural = (self.schedule.as_ref())
            .zip(action.step)
            .is_some_and(|(schedule, step)| schedule.how(step).newer_first);
        let waited = self.natural_waits.get(&action.target).copied().unwrap_or(0);
        if !natural || waited >= NATURAL_WAITS {
            return false;
        }
        let Some(seat) = self.seats.iter().find(|s| s.client.name == action.target) else {
            return false;
        };
        let Some(job) = seat.job.map(|(job, _)| job).filter(|&job| job > 0) else {
            return false;
        };
        let record = self.spec(job).record.clone();
        let others: Vec<String> = (self.seats.iter())
            .filter(|s| s.client.name != action.target && s.client.is_running())
            .filter(|s| (s.job).is_some_and(|(j, _)| j > 0 && self.spec(j).record == record))
            .map(|s| s.client.name.clone())
            .collect();
        if others.is_empty() {
            return false;
        }
        self.natural_waits.insert(action.target.clone(), waited + 1);
        let resume = (self.faults.as_mut()).and_then(|f| f.withdraw(&action.target, Fault::Resume));
        if waited > 0 {
            // Said once: the timeline says when it plays.
            let postponed = Postponed {
                action: action.clone(),
                resume,
            };
            self.postponed.insert(action.target.clone(), postponed);
            return true;
        }
        let text = format!(
            "{}'s {} waits for a `writing` note on a record no other client has a job on (it \
             plays the natural order there; {NATURAL_WAITS} notes at most): {} {} a job on \
             {record} too",
            action.target,
            action.fault.as_str(),
            others.join(" and "),
            if others.len() > 1 { "have" } else { "has" }
        );
        self.postpone(action, resume, text);
        true
    }

    /// The client, other than `client`, whose pause or delay is armed or playing — or
    /// whose held write the worst order lets go before `client`'s ([`overtake`]).
    pub(super) fn other_fault_on(&self, client: &str) -> Option<String> {
        if let Some(overtake) = self.overtaking.as_ref().filter(|o| o.newer == client) {
            return Some(overtake.older.clone());
        }
        let paused = self.paused();
        (self.seats.iter())
            .map(|s| &s.client.name)
            .find(|name| {
                *name != client && (self.write_held(&paused, name) || self.aimed.is_armed(name))
            })
            .cloned()
    }

    /// The notes logged since the last look, each shown to the faults that wait for
    /// another's to end ([`Run::rearm_postponed`]).
    fn rearm_at_new_notes(&mut self) {
        let from = self.looked.min(self.tape.events.len());
        self.looked = self.tape.events.len();
        if self.postponed.is_empty() || self.faults.is_none() {
            return;
        }
        for at in from..self.looked {
            let event = self.tape.events[at].clone();
            self.rearm_postponed(&event);
        }
    }

    /// A client's note: a fault that waited for another's to end is due again, at this
    /// note as its step's anchor would have put it, if it is that kind of note and no
    /// other fault is on now.
    fn rearm_postponed(&mut self, event: &crate::events::Event) {
        let Some(postponed) = self.postponed.get(&event.worker) else {
            return;
        };
        let step = (self.schedule.as_ref())
            .zip(postponed.action.step)
            .and_then(|(schedule, at)| schedule.steps().get(at));
        let Some(step) = step.filter(|s| {
            (s.after.as_ref()).is_some_and(|a| a.points().iter().any(|p| p.matches(event)))
        }) else {
            return;
        };
        if self.other_fault_on(&event.worker).is_some() {
            return;
        }
        let step_ms = step.at_ms;
        let Some(Postponed { action, resume }) = self.postponed.remove(&event.worker) else {
            return;
        };
        let Some(faults) = self.faults.as_mut() else {
            return;
        };
        let at_ms = faults.schedule_ms(event.t_ms) + step_ms;
        if let Some(resume) = resume {
            // As long after the fault as drawn.
            let lasts = resume.at_ms.saturating_sub(action.at_ms);
            faults.add(Action {
                at_ms: at_ms + lasts,
                ..resume
            });
        }
        faults.add(Action { at_ms, ..action });
    }

    pub(super) fn start_schedule(&mut self) -> Result<()> {
        let clients: Vec<(String, bool)> = self
            .seats
            .iter()
            .map(|s| (s.client.name.clone(), s.notes))
            .collect();
        let lockless = (self.seats.iter())
            .filter(|s| !s.lock)
            .map(|s| s.client.name.clone())
            .collect();
        let schedule = self.setup.challenge.schedule_with(
            self.setup.seed,
            &clients,
            &lockless,
            self.setup.init.lease_ms,
        );
        let names: Vec<&str> = clients.iter().map(|(n, _)| n.as_str()).collect();
        schedule.validate(&names, &[])?;
        let mut faults = Faults::new(&schedule, &self.tape);
        if let Some(failover) = &self.failover {
            let primary_url = failover.primary_url();
            faults = faults.on_replica(failover::REPLICA, move || primary_url.clone());
        }
        self.looked = self.tape.events.len();
        self.faults = Some(faults);
        self.schedule = Some(schedule);
        Ok(())
    }

    /// The clients (and the failover's Redis) the nemesis holds paused, by name.
    pub(super) fn paused(&self) -> Vec<String> {
        self.faults.as_ref().map(Faults::paused).unwrap_or_default()
    }

    /// Has the schedule's player do `action` now, in `words`.
    pub(super) fn play(&mut self, action: &Action, words: impl Into<Note>) -> Result<()> {
        let (due, words) = (Due::Fault(action.clone()), words.into());
        self.on_stage(|faults, tape, nemesis, cast| {
            faults.act_saying(due, words, tape, nemesis, cast)
        })
    }

    /// Adds `fault` on `target` to the schedule, due now, and has the player do it at
    /// once, in the words `words` makes of its cue.
    pub(super) fn play_now(
        &mut self,
        (fault, target, how): (Fault, &str, How),
        words: impl FnOnce(&Cue) -> Note + 'static,
    ) -> Result<()> {
        self.on_stage(|faults, tape, nemesis, cast| {
            faults.play_now((tape, nemesis, cast), (fault, target, how), words)
        })
    }

    /// Hands the player, once the schedule has started, what it plays on: the run's
    /// history, the nemesis, and the cast it aims at ([`cast`]).
    fn on_stage(
        &mut self,
        play: impl FnOnce(
            &mut Faults<'static>,
            &mut Tape,
            &mut Nemesis,
            &mut [&mut dyn Victim],
        ) -> Result<()>,
    ) -> Result<()> {
        let Run {
            faults,
            tape,
            nemesis,
            seats,
            failover,
            ..
        } = self;
        let Some(faults) = faults.as_mut() else {
            return Ok(());
        };
        play(faults, tape, nemesis, &mut cast(seats, failover))
    }

    /// Plays one fault of the schedule, if its client can take it now.
    pub(super) fn act(&mut self, action: &Action) -> Result<()> {
        let name = action.target.clone();
        let paused = self.paused().contains(&name);
        let Some(index) = self.seats.iter().position(|s| s.client.name == name) else {
            return Ok(());
        };
        if !self.seats[index].client.is_running() {
            return Ok(());
        }
        match action.fault {
            Fault::Pause if !paused && !self.aimed_at_write(action) => {
                self.pause_in_the_work(index, action)?
            }
            // Aimed at its write: it lands as the write reaches the proxy (`aim`).
            Fault::Pause if !paused => self.aim_pause(index, action)?,
            Fault::Resume if paused => {
                self.play(action, format!("resumes {name}"))?;
                // Its time to answer counts again from now.
                if let Some((_, since)) = self.seats[index].job.as_mut() {
                    *since = Instant::now();
                }
            }
            Fault::Delay => self.aim_delay(index, action)?,
            Fault::Kill => {
                // Killed at its `released` note: the kill that should fall between a
                // commit and its answer (graded as missed if the job's change came later).
                let released = self.said_released(index);
                if let Some((job, _)) = self.seats[index].job {
                    self.moment(&name, job, Moment::Killed);
                }
                let seat = &self.seats[index];
                let current = seat.job.map(|(job, _)| job).filter(|&job| job > 0);
                let mut strike = Strike {
                    fault: "kill".into(),
                    client: name.clone(),
                    job: current.or(seat.last_job),
                    answered: current.is_none() && seat.last_job.is_some(),
                    notes: seat.notes,
                    lockless: !seat.lock,
                    released,
                    ..Strike::default()
                };
                self.killed.insert(name.clone());
                self.play(action, format!("kills {name} (SIGKILL) mid-job"))?;
                strike.at_us = crate::challenge::table::clock_us(&mut self.clock)?;
                self.strikes.push(strike);
                self.faults_played += 1;
                self.played.push((name.clone(), Fault::Kill));
                let orphan = self.seats[index].job.take().map(|(job, _)| job);
                if let Some(job) = orphan.filter(|&job| job > 0) {
                    self.give_again(job);
                }
                let next = format!("c{}", self.seats.len() + 1);
                self.start_client(&next)?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether the schedule aims `action` at its target's next write (`How::at_write`).
    fn aimed_at_write(&self, action: &Action) -> bool {
        let how = |step| {
            self.faults
                .as_ref()
                .map(|f| f.schedule().how(step).at_write)
        };
        action.step.and_then(how).unwrap_or(true)
    }

    /// `pause`'s pause in the middle of a client's work: it lands now, wherever the client
    /// is — between its `writing` note and its write, most often — with no write caught.
    fn pause_in_the_work(&mut self, index: usize, action: &Action) -> Result<()> {
        let seat = &self.seats[index];
        let name = seat.client.name.clone();
        let since = (seat.heard_at).map_or(0, |at| at.elapsed().as_millis());
        let text = format!(
            "pauses {name} (SIGSTOP) for 2–3 TTLs {since}ms after its last note, in the \
             middle of its work: a pause can come anywhere, not only at the write"
        );
        self.play(action, text)?;
        self.faults_played += 1;
        self.strike("pause", index, action)?;
        if let Some(strike) = self.strikes.last_mut() {
            strike.in_the_work = true;
        }
        Ok(())
    }

    /// The client at `index` holds a job and its last note of it was `released`.
    fn said_released(&self, index: usize) -> bool {
        let seat = &self.seats[index];
        seat.job.is_some_and(|(job, _)| job > 0)
            && (self.moments.iter().rev())
                .find(|m| m.client == seat.client.name)
                .is_some_and(|m| m.what == Moment::Released)
    }

    /// A pause or a delay as it began (the schedule's `action`): the job its client had,
    /// whether it had let that job's lock go, the order it plays when a newer holder comes,
    /// and the database's clock — whether it bit is read from the log.
    pub(super) fn strike(
        &mut self,
        fault: &'static str,
        index: usize,
        action: &Action,
    ) -> Result<()> {
        let newer_first = (self.schedule.as_ref())
            .zip(action.step)
            .is_some_and(|(schedule, step)| schedule.how(step).newer_first);
        let seat = &self.seats[index];
        let client = seat.client.name.clone();
        let current = seat.job.map(|(job, _)| job).filter(|&job| job > 0);
        let answered = current.is_none() && seat.last_job.is_some();
        let job = current.or(seat.last_job);
        let notes = seat.notes;
        let lockless = !seat.lock;
        let (base, base_us) = self.clock_base;
        let note_us = seat
            .heard_at
            .map(|at| base_us + at.saturating_duration_since(base).as_micros() as i64);
        let released = self.said_released(index);
        let at_us = crate::challenge::table::clock_us(&mut self.clock)?;
        let kind = if fault == "pause" {
            Fault::Pause
        } else {
            Fault::Delay
        };
        self.played.push((client.clone(), kind));
        self.strikes.push(Strike {
            fault: fault.into(),
            client,
            job,
            answered,
            at_us,
            note_us,
            notes,
            released,
            refused: false,
            matched_nothing: false,
            newer_refused: false,
            lockless,
            held_off: None,
            overtaken: false,
            overtaken_by: None,
            newer_tried: None,
            newer_session: None,
            newer_first,
            ..Strike::default()
        });
        self.find_lock(index, kind);
        Ok(())
    }

    /// Each fault of the schedule that never played, and the moment it waited for.
    pub(super) fn unplayed(&self, schedule: &Schedule) -> Vec<String> {
        let mut played = self.played.clone();
        let mut lines = Vec::new();
        for step in schedule.steps() {
            let hit = (step.target.clone(), step.fault);
            if let Some(i) = played.iter().position(|p| *p == hit) {
                played.remove(i);
                continue;
            }
            if let Some(line) = self.never_written(&step.target, step.fault) {
                lines.push(line);
                continue;
            }
            if (self.postponed.get(&step.target)).is_some_and(|p| p.action.fault == step.fault) {
                lines.push(format!(
                    "the {} of {} waited for another client's fault to end (one at a time), \
                     then for its next `writing` note, and the run ended first",
                    step.fault.as_str(),
                    step.target
                ));
                continue;
            }
            let Some(anchor) = &step.after else { continue };
            let moment = if anchor.event == Kind::Working.into() {
                "`writing` note"
            } else if anchor.event == Kind::Acquired.into() {
                "`acquired` note"
            } else if anchor.event == Kind::Released.into() {
                "`released` note"
            } else if anchor.event == Kind::JobAnswered.into() {
                "answer"
            } else {
                "job"
            };
            // Jobs go to whichever client is free: one may get too few to reach the note.
            let given = (self.deliveries.iter())
                .filter(|d| d.client == step.target)
                .count();
            let why = if self.killed.contains(&step.target) {
                ", and it was killed before that".to_string()
            } else if given < anchor.nth as usize {
                format!(
                    ": it was given {given} job{} in the run, too few to reach it (the \
                     schedule's miss, not the client's)",
                    if given == 1 { "" } else { "s" }
                )
            } else {
                let jobs = if given == 1 { "job" } else { "jobs" };
                format!(": it was given {given} {jobs}")
            };
            lines.push(format!(
                "the {} of {} waited for its {moment} #{}, which never came{why}",
                step.fault.as_str(),
                step.target,
                anchor.nth
            ));
        }
        lines
    }
}

/// What the nemesis may aim at in a run: its clients, and the failover's Redis primary and
/// replica.
fn cast<'c>(
    seats: &'c mut [Seat],
    failover: &'c mut Option<super::failover::Failover<'_>>,
) -> Vec<&'c mut dyn Victim> {
    let mut cast: Vec<&mut dyn Victim> = (seats.iter_mut())
        .map(|seat| &mut seat.client as &mut dyn Victim)
        .collect();
    if let Some(failover) = failover.as_mut() {
        cast.extend(failover.victims());
    }
    cast
}

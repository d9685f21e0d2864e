//! The challenge's faults, played on its clients: the schedule drawn from the seed, each
//! action when it falls due, and a held write's end when the proxy lets it go.

use super::*;
use crate::events::Kind;

impl Run<'_> {
    pub(super) fn play_due(&mut self) -> Result<()> {
        let now = self.tape.start.elapsed().as_millis() as u64;
        let due = self.player.as_mut().map(|p| p.due(now)).unwrap_or_default();
        for action in due {
            self.act(&action)?;
        }
        Ok(())
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
        self.player = Some(Player::new(&schedule));
        self.schedule = Some(schedule);
        Ok(())
    }

    /// A held write that went out ends its fault, on the timeline where it landed.
    pub(super) fn heal_delivered(&mut self) {
        for seat in &self.seats {
            let Some(proxy) = &seat.proxy else { continue };
            for report in proxy.reports() {
                if let Seen::DelayedSent { late_ms } = report.seen {
                    let name = &seat.client.name;
                    self.held_writes.remove(name);
                    // `held_ms` is the number the line says; `lasted_ms` (the nemesis's)
                    // counts from when the delay was set, before the bytes came.
                    let text =
                        format!("{name}'s bytes reach Postgres, held {late_ms}ms in the proxy");
                    let facts = crate::events::facts::FaultFacts {
                        held_ms: Some(late_ms),
                        ..Default::default()
                    };
                    let note = crate::nemesis::Note::new(text, facts);
                    self.nemesis
                        .heal_net(&mut self.tape, proxy, Direction::Up, note);
                }
            }
        }
    }

    /// Plays one fault of the schedule, if its client can take it now.
    pub(super) fn act(&mut self, action: &Action) -> Result<()> {
        let name = action.target.clone();
        let paused = self.nemesis.paused().contains(&name);
        let Some(index) = self.seats.iter().position(|s| s.client.name == name) else {
            return Ok(());
        };
        if !self.seats[index].client.is_running() {
            return Ok(());
        }
        let held_after_its_read = (self.overtaking.as_ref()).is_some_and(|o| o.newer == name);
        match action.fault {
            // Its own pause falls due while lockslab holds it after its read (the worst
            // order, `overtake`): the pause takes that hold over, and ends when it ends.
            Fault::Pause if paused && held_after_its_read => {
                self.overtaking = None;
                self.faults_played += 1;
                self.strike("pause", index)?;
            }
            Fault::Pause if !paused => {
                let seat = &self.seats[index];
                self.nemesis.pause(
                    &mut self.tape,
                    &seat.client,
                    format!("pauses {name} (SIGSTOP) for 2–3 TTLs"),
                )?;
                self.faults_played += 1;
                self.strike("pause", index)?;
            }
            Fault::Resume if paused => {
                let seat = &mut self.seats[index];
                self.nemesis
                    .resume(&mut self.tape, &seat.client, format!("resumes {name}"))?;
                // Its time to answer counts again from now.
                if let Some((_, since)) = seat.job.as_mut() {
                    *since = Instant::now();
                }
            }
            Fault::Delay => {
                let Some(proxy) = &self.seats[index].proxy else {
                    return Ok(());
                };
                let setup = self.setup;
                let ms = Challenge::delay_ms(setup.seed, &name, setup.init.lease_ms);
                let text = format!("delays {name}'s next bytes to Postgres by {ms}ms (proxy)");
                let fault = NetFault::DelayNext { ms };
                self.nemesis
                    .net(&mut self.tape, proxy, Direction::Up, fault, text);
                self.faults_played += 1;
                self.strike("delay", index)?;
                self.held_writes.insert(name);
            }
            Fault::Kill => {
                if let Some((job, _)) = self.seats[index].job {
                    self.moment(&name, job, Moment::Killed);
                }
                let seat = &self.seats[index];
                let current = seat.job.map(|(job, _)| job).filter(|&job| job > 0);
                self.strikes.push(Strike {
                    fault: "kill",
                    client: name.clone(),
                    job: current.or(seat.last_job),
                    answered: current.is_none() && seat.last_job.is_some(),
                    notes: seat.notes,
                    lockless: !seat.lock,
                    ..Strike::default()
                });
                let seat = &mut self.seats[index];
                self.killed.insert(name.clone());
                self.nemesis.kill(
                    &mut self.tape,
                    &mut seat.client,
                    format!("kills {name} (SIGKILL) mid-job"),
                )?;
                self.faults_played += 1;
                self.played.push((name.clone(), Fault::Kill));
                let orphan = seat.job.take().map(|(job, _)| job);
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

    /// A pause or a delay as it began: the job its client had, whether it had let that
    /// job's lock go, and the database's clock — whether it bit is read from the log.
    fn strike(&mut self, fault: &'static str, index: usize) -> Result<()> {
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
        let released = current.is_some()
            && self
                .moments
                .iter()
                .rev()
                .find(|m| m.client == client)
                .is_some_and(|m| m.what == Moment::Released);
        let at_us = crate::challenge::table::clock_us(&mut self.clock)?;
        let kind = if fault == "pause" {
            Fault::Pause
        } else {
            Fault::Delay
        };
        self.played.push((client.clone(), kind));
        self.strikes.push(Strike {
            fault,
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
        });
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
            let promised = if !moment.ends_with("note") {
                ""
            } else {
                " (it promised notes when it said ready)"
            };
            let killed = if self.killed.contains(&step.target) {
                ", and it was killed before that"
            } else {
                ""
            };
            lines.push(format!(
                "the {} of {} waited for its {moment} #{}, which never came{killed}{promised}",
                step.fault.as_str(),
                step.target,
                anchor.nth
            ));
        }
        lines
    }
}

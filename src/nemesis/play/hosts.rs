//! The player's part for hosts ([`crate::hosts`]): partitions and their heals, and
//! leaders' stalls, each done by the nemesis ([`super::super::partition`]).

use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Cue, Faults, Floor};
use crate::hosts::Sides;
use crate::nemesis::schedule::{Action, How};
use crate::nemesis::{Fault, Nemesis, Victim};
impl<'a> Cue<'a> {
    /// The cue of a fault that neither restarts nor cuts a replica's link.
    fn on(action: &'a Action, how: &'a How, pid: i32, held: Option<Duration>) -> Cue<'a> {
        Cue {
            action,
            pid,
            held,
            back_after: None,
            how,
            links_closed: None,
            net: None,
        }
    }
}

/// Partitions between hosts, and leaders' stalls.
impl Faults<'_> {
    /// How the action's step is done (the usual way for a resume that ends a stall).
    fn how_of(&self, action: &Action) -> How {
        (action.step)
            .map(|i| self.schedule.how(i).clone())
            .unwrap_or_default()
    }

    /// A partition, or the heal of one: a heal aimed at no proxy path of this play, when
    /// it has hosts.
    pub(super) fn is_partition(&self, action: &Action) -> bool {
        match action.fault {
            Fault::Partition => true,
            Fault::Heal => {
                self.hosts.is_some() && !self.paths.iter().any(|p| p.path() == action.target)
            }
            _ => false,
        }
    }

    /// A leader's stall, or the resume that ends one.
    pub(super) fn is_stall(&self, action: &Action) -> bool {
        action.fault == Fault::LeaderStall
            || (action.fault == Fault::Resume && self.stalled.contains_key(&action.target))
    }

    pub(super) fn partition(
        &mut self,
        action: Action,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
    ) -> Result<()> {
        let Some(hosts) = self.hosts else {
            return self.skip(&action, "this run has no hosts to partition".into());
        };
        let sides: Sides = action.target.parse()?;
        let how = self.how_of(&action);
        let note = self.say(&Cue::on(&action, &how, 0, None));
        if action.fault == Fault::Heal {
            nemesis.heal_partition(floor, hosts, &sides, note)?;
        } else {
            nemesis.partition(floor, hosts, &sides, note)?;
        }
        self.acted.push(action);
        Ok(())
    }

    /// Stalls whoever leads the cluster now, or resumes the one this play stalled.
    pub(super) fn stall(
        &mut self,
        action: Action,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
    ) -> Result<()> {
        let cluster = action.target.clone();
        let leader = match action.fault {
            Fault::Resume => self.stalled.remove(&cluster),
            _ => match self.leaders.iter().find(|(c, _)| *c == cluster) {
                Some((_, leader)) => leader(),
                None => {
                    let why = format!("this run cannot tell who leads {cluster}");
                    return self.skip(&action, why);
                }
            },
        };
        let Some(leader) = leader else {
            return self.skip(&action, format!("{cluster} had no leader"));
        };
        let Some(victim) = cast.iter().find(|v| v.label() == leader) else {
            let why = format!("{cluster}'s leader {leader} is not one this run can stop");
            return self.skip(&action, why);
        };
        let how = self.how_of(&action);
        let held = (action.fault == Fault::Resume)
            .then(|| self.paused_at.remove(&leader).map(|at| at.elapsed()))
            .flatten();
        let pid = victim.pid().unwrap_or_default();
        let note = self.say(&Cue::on(&action, &how, pid, held));
        if action.fault == Fault::Resume {
            nemesis.resume(floor, &**victim, note)?;
        } else {
            nemesis.stall(floor, &**victim, note)?;
            self.stalled.insert(cluster, leader.clone());
            self.paused_at.insert(leader, Instant::now());
        }
        self.acted.push(action);
        Ok(())
    }
}

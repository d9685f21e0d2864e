//! The worst order for a held write (`pause`, `delay`): a newer holder of the record has
//! read it and says `writing` — lockslab has its proxy hold its next write that would change
//! the record in any column, a claim that sets only `fence` too (`NetFault::HoldFirstTouch`),
//! lets the older holder's held write go (resumes it, or releases its bytes from its proxy),
//! and lets the newer holder's write go once that one has been answered.
//!
//! ```text
//!  c1  acquired (token 5) · reads r0 = 7 · writing ──── frozen, or its write held ────┐
//!  c2                      … acquired (token 6) · reads r0 = 7 · writing · UPDATE ─┐  │
//!                                        lockslab: c2's write held at its proxy ─┘  let c1 go
//!  c1                                                        writes r0 = 7 + 2, fence 5 ◀┘
//!  c2                                                        (let go) writes r0 = 7 + 3, fence 6
//! ```
//!
//! A client that checks its token only at its write lets both writes in — 5 is above every
//! fence r0 had, 6 above 5 — and c1's +2 is lost. One whose token claims the row before the
//! read refuses c1's write (r0 is claimed by 6 already). Left to the clock, c1's write would
//! land after c2's, where a check at the write alone suffices: without this order, the
//! `pause` and `delay` challenges could not tell the two fences apart.
//!
//! The newer holder is held at its write, not at its note: whatever it read, it read before
//! its write, so the older write lands after its read however early it said `writing`. Its
//! held write is tried first, in its own session (`proxy::dry_run`): an UPDATE that would
//! have changed the records then and matches nothing once the older write landed is a
//! refusal the database made; one that matches nothing whenever it runs is none.

use super::*;
use crate::nemesis::Note;
use crate::nemesis::schedule::How;
use crate::output::human;
use crate::proxy::{Direction, NetFault, TRY_LOCK_TIMEOUT_MS, Tried};

/// A newer holder whose write is held at its proxy while an older holder's write goes first.
pub(super) struct Overtake {
    /// The newer holder, and the job it holds.
    pub(super) newer: String,
    newer_job: i64,
    /// The older holder let go, and the job whose write it held.
    pub(super) older: String,
    job: i64,
    /// The fault that held the older write, to follow the newer holder's job with
    /// ([`Run::follow_the_newer`]). None if that write was itself a follow-up of a fault on
    /// its job (a retry): else every worst order would start another.
    follow_the_newer: Option<aim::Follow>,
    /// The newer holder's write is held at its proxy (else it is still to come).
    held: bool,
    /// To come: when to stop waiting for it. Held: when to let it go if the older holder
    /// has not answered by then.
    until: Instant,
}

/// An older holder's write held while the newer holder writes first: its retry
/// ([`Run::followed_into_the_worst_order`]), or the write its fault holds, dealt the natural
/// order.
pub(super) struct RetryHeld {
    older: String,
    newer: String,
    newer_job: i64,
    order: Order,
    /// When to let the retry go if the newer holder has not answered by then.
    until: Instant,
}

/// Why an older holder's held write waits for a newer holder's answer
/// ([`Run::newer_writes_first`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Order {
    /// A retry, after the worst order let it go: its read came after the write that refused it.
    Retry,
    /// The fault was dealt the natural order.
    Natural,
}

/// How long the newer holder's write is held at most: the older one's write and answer take
/// milliseconds, unless it waits for a row lock the newer one holds.
const HOLD_AT_MOST: Duration = Duration::from_secs(1);

impl Run<'_> {
    /// After a `writing` note: if another client's write to the same record is held (its
    /// client frozen by a pause, or its bytes in the proxy by a delay), the newer holder's
    /// proxy holds its next write, and the worst order plays when it comes
    /// ([`Run::newer_write_held`]).
    pub(super) fn overtake(&mut self) -> Result<()> {
        let Some((newer, job)) = self.writing.take() else {
            return Ok(());
        };
        let challenge = self.setup.challenge;
        let playing = self.overtaking.is_some() || self.retry_held.is_some();
        if playing || !matches!(challenge, Challenge::Pause | Challenge::Delay) {
            return Ok(());
        }
        let paused = self.paused();
        if paused.contains(&newer) || self.aimed.is_armed(&newer) {
            // Frozen at that note by its own pause (an older holder now), or its own fault
            // waits for that write.
            return Ok(());
        }
        let record = self.spec(job).record.clone();
        let held = |seat: &Seat| {
            let name = &seat.client.name;
            *name != newer
                && seat.client.is_running()
                && self.write_held(&paused, name)
                && seat
                    .job
                    .is_some_and(|(held, _)| held > 0 && self.spec(held).record == record)
        };
        let Some(older) = self.seats.iter().position(held) else {
            return Ok(());
        };
        let Some(at) = self.seats.iter().position(|s| s.client.name == newer) else {
            return Ok(());
        };
        let (older_name, older_job) = {
            let seat = &self.seats[older];
            (seat.client.name.clone(), seat.job.map_or(0, |(job, _)| job))
        };
        if self
            .retries_to_hold
            .remove(&(older_name.clone(), older_job))
        {
            return self.newer_writes_first(older, &newer, job, Order::Retry);
        }
        let natural = (self.strikes.iter().rev())
            .find(|s| s.client == older_name && s.job == Some(older_job))
            .is_some_and(|s| s.newer_first);
        if natural && (self.naturals_played).insert((older_name.clone(), older_job)) {
            return self.newer_writes_first(older, &newer, job, Order::Natural);
        }
        let Some(proxy) = &self.seats[at].proxy else {
            return Ok(());
        };
        // At its first write of the row, a claim too: a claim made after its read lands
        // before the older write otherwise, and refuses it — the order would test nothing.
        proxy.set(Direction::Up, NetFault::HoldFirstTouch);
        let older_followed = (self.strikes.iter().rev())
            .find(|s| s.client == older_name && s.job == Some(older_job))
            .is_some_and(|s| s.follows);
        let follow_the_newer = (!older_followed)
            .then(|| self.aimed.followed_for(&older_name))
            .flatten();
        // Behind a held commit the newer holder's write, tried as it comes, waits for the
        // row the older holder's uncommitted write holds, to the try's lock timeout.
        let mut patience = aim::patience(self.setup.init.lease_ms);
        if self.aimed.held_what(&older_name) == "commit" {
            patience += Duration::from_millis(TRY_LOCK_TIMEOUT_MS.into());
        }
        self.overtaking = Some(Overtake {
            newer,
            newer_job: job,
            older: older_name,
            job: older_job,
            follow_the_newer,
            held: false,
            until: Instant::now() + patience,
        });
        Ok(())
    }

    /// `newer`, who has read the record since the held write was held, writes first, and the
    /// held write goes once `newer` has answered its job: a stale write arriving last. A
    /// write that checks nothing (a blind write, a compare dropped after a refusal) lands on
    /// `newer`'s and erases it, which the data shows; a compare-and-set, or a fence checked
    /// in the write, matches nothing and is refused.
    ///
    /// `Order::Natural`: the fault was dealt this order ([`How::newer_first`]). Only the
    /// worst order played, a design careful only while another client's job on the record
    /// is open — a compare-and-set when someone's lock ran out, a blind write otherwise —
    /// passed: the held write, blind, always landed before the newer holder's compare.
    ///
    /// ```text
    ///  c1  acquired · reads r0 = 7 · writing ── frozen, or its write held ─────────────┐
    ///  c2           … acquired · reads r0 = 7 · writing · writes r0 = 7 + 3 · ok         │
    ///  c1                                         (let go) writes r0 = 7 + 2, erasing +3 ◀┘
    /// ```
    ///
    /// `Order::Retry`: the held write is a newer holder's next write after the worst order
    /// let it go ([`Run::follow_the_newer`]): its read came after the write it was refused
    /// by, so the order that tests it is this one. A compare-and-set is refused again and
    /// reads afresh; a write that dropped its guard after a refusal lands on `newer`'s and
    /// erases it.
    ///
    /// ```text
    ///  c3  (newer holder, let go)  UPDATE … matches 0 rows · reads r0 · writing ── held ──┐
    ///  c1                                        acquired · reads r0 · writes r0 = 9 + 4  │
    ///  c3                                                   writes r0 = 9 + 3 (after c1) ◀┘
    /// ```
    fn newer_writes_first(
        &mut self,
        older: usize,
        newer: &str,
        newer_job: i64,
        order: Order,
    ) -> Result<()> {
        let (name, job) = {
            let seat = &self.seats[older];
            (seat.client.name.clone(), seat.job.map_or(0, |(job, _)| job))
        };
        if self.paused().contains(&name)
            && let Some(faults) = self.faults.as_mut()
        {
            // Held until `newer` answers, not until the pause's own time is up.
            faults.withdraw(&name, Fault::Resume);
        }
        let (text, until) = match order {
            Order::Retry => {
                self.retries_held.insert((name.clone(), job));
                let text = format!(
                    "lets {newer} write first: {name}'s held write is its next of job {job} \
                     after the one the worst order held (a retry), and goes once {newer}'s \
                     write is answered"
                );
                (text, HOLD_AT_MOST)
            }
            Order::Natural => {
                let held = self.what_is_held(&name);
                let text = format!(
                    "lets {newer} write first, the natural order: {held} goes once {newer} has \
                     answered job {newer_job} — a stale write arriving last"
                );
                (text, aim::patience(self.setup.init.lease_ms) + HOLD_AT_MOST)
            }
        };
        self.note(crate::nemesis::LANE, What::Output, text);
        self.retry_held = Some(RetryHeld {
            older: name,
            newer: newer.to_string(),
            newer_job,
            order,
            until: Instant::now() + until,
        });
        Ok(())
    }

    /// Is `index`'s write the one the worst order waits for?
    pub(super) fn newer_write_awaited(&self, index: usize) -> bool {
        let name = &self.seats[index].client.name;
        (self.overtaking.as_ref()).is_some_and(|o| !o.held && o.newer == *name)
    }

    /// The newer holder's write came, and its proxy holds it (tried first: `tried`, in
    /// `session`): the older holder's write goes now — resumed, or its bytes let go — and
    /// the newer one's after it has been answered ([`Run::end_overtake`]).
    pub(super) fn newer_write_held(
        &mut self,
        index: usize,
        tried: Tried,
        session: Option<i32>,
    ) -> Result<()> {
        let Some(overtake) = self.overtaking.as_mut() else {
            return Ok(());
        };
        overtake.held = true;
        overtake.until = Instant::now() + HOLD_AT_MOST;
        if tried == Tried::Claims {
            // Held at its claim: its next write is the one it computed from its read, no
            // retry — it goes as it comes, not held for yet another holder to go first.
            overtake.follow_the_newer = None;
        }
        let (newer, older, older_job) =
            (overtake.newer.clone(), overtake.older.clone(), overtake.job);
        let newer_job = overtake.newer_job;
        let record = self.spec(newer_job).record.clone();
        if let (Some(proxy), Some(faults)) = (&self.seats[index].proxy, self.faults.as_mut()) {
            let action = Action {
                at_ms: faults.now_ms(&self.tape),
                fault: Fault::Hold,
                target: newer.clone(),
                step: None,
            };
            let what = self.aimed.held_what(&older);
            let text = format!(
                "holds {newer}'s write at its proxy, after its read of {record}: {older}'s \
                 {what} first"
            );
            faults.caught(
                action,
                proxy,
                Note::from(text),
                (&mut self.tape, &mut self.nemesis),
            );
        }
        let paused = self.paused();
        let Some(at) = self.seats.iter().position(|s| s.client.name == older) else {
            return Ok(());
        };
        if !self.write_held(&paused, &older) {
            // Its fault ended meanwhile, and its write went: nothing to go before.
            if let Some(overtake) = self.overtaking.as_mut() {
                overtake.until = Instant::now();
            }
            return Ok(());
        }
        if paused.contains(&older) {
            let early = format!("resumes {older} early, after {newer}'s read");
            self.resume_to_write(&older, early)?;
        } else if let (Some(proxy), Some(faults)) = (&self.seats[at].proxy, self.faults.as_mut()) {
            let what = self.aimed.held_what(&older);
            let note = format!(
                "lets {older}'s held {what} go early, after {newer}'s read: the worst order, \
                 {older}'s {what} between {newer}'s read and its write"
            );
            faults.let_go(proxy, Note::from(note), (&mut self.tape, &mut self.nemesis));
            // Let go early, its bytes are not reported as a late delivery: its write is no
            // longer held, or every later `writing` on the record would be held for it.
            self.held_writes.remove(&older);
        }
        let bit = (self.strikes.iter_mut())
            .filter(|s| s.client == older && s.job == Some(older_job) && !s.answered);
        for strike in bit {
            strike.overtaken = true;
            strike.overtaken_by = Some(newer_job);
            strike.newer_tried = Some(tried.clone());
            strike.newer_session = session;
        }
        Ok(())
    }

    /// The older holder's write, let go first, was refused, and its retry (read afresh) is
    /// held again by the fault that follows its job, while the newer holder's write is still
    /// held at its proxy. The first time in a job, the newer write goes now, and the retry
    /// waits until its write has been answered ([`Run::let_the_retry_go`]): the retry then
    /// meets a write that landed after its read, as the first held write did. A retry that
    /// drops its guard — a blind write after a refused compare — lands on that write and
    /// erases it, which the data shows; a compare-and-set's retry is refused and reads
    /// again. From the second time in a job, the retry goes at once, before the newer
    /// holder's write: a compare-and-set, refused by every newer write it is made to wait
    /// for while other clients write too, would otherwise lose every round until the fault
    /// gave up following it (the run unknown).
    pub(super) fn followed_into_the_worst_order(&mut self, older: &str, fresh: bool) -> Result<()> {
        if self.overtaking.as_ref().is_none_or(|o| o.older != older) {
            return Ok(());
        }
        if !fresh {
            // No new `writing` note since its last held write: perhaps made before the
            // retry's read (a claim, a touch of the row). It goes at once; the order is
            // played on the write after its next note.
            let why = "this write of its job came with no new `writing` note (made before a \
                       read, perhaps), so the order waits for its write after the next one";
            return self.let_the_retry_go_first(older, why);
        }
        let job = (self.seats.iter().find(|s| s.client.name == older))
            .and_then(|s| s.job.map(|(job, _)| job));
        let Some(job) = job else {
            return Ok(());
        };
        if !self.retries_held.insert((older.to_string(), job)) {
            let why = "its job's retry was held for a newer write once already";
            return self.let_the_retry_go_first(older, why);
        }
        let Some(overtake) = self.overtaking.take() else {
            return Ok(());
        };
        let newer = overtake.newer.clone();
        let words = format!(
            "lets {newer}'s write go first: {older}'s retry is held until {newer}'s write is \
             answered"
        );
        self.let_the_newer_write(&overtake, words);
        self.retry_held = Some(RetryHeld {
            older: older.to_string(),
            newer,
            newer_job: overtake.newer_job,
            order: Order::Retry,
            until: Instant::now() + HOLD_AT_MOST,
        });
        Ok(())
    }

    /// A retry held while the newer holder's write waits at its proxy goes at once, before
    /// that holder's write (resumed, or its bytes let go), `why` said on the timeline: held
    /// once already in its job, or held with no new `writing` note since its last held
    /// write.
    fn let_the_retry_go_first(&mut self, older: &str, why: &str) -> Result<()> {
        let Some(newer) = self.overtaking.as_ref().map(|o| o.newer.clone()) else {
            return Ok(());
        };
        let Some(index) = self.seats.iter().position(|s| s.client.name == older) else {
            return Ok(());
        };
        let resume = format!(
            "resumes {older} at once: {why}, and {newer}'s write is held, so the retry goes \
             first"
        );
        let let_go = format!(
            "lets {older}'s retry go at once: {why}, and {newer}'s write is held, so the \
             retry goes first"
        );
        self.release_retry(index, resume, let_go)
    }

    /// Lets `index`'s held retry go: its client resumed (its pause's end withdrawn, not
    /// played again later), or its bytes let go from its proxy; the timeline says `resume`
    /// or `let_go`.
    fn release_retry(&mut self, index: usize, resume: String, let_go: String) -> Result<()> {
        let older = self.seats[index].client.name.clone();
        if self.paused().contains(&older) {
            if let Some(faults) = self.faults.as_mut() {
                faults.withdraw(&older, Fault::Resume);
            }
            return self.resume_to_write(&older, resume);
        }
        if self.held_writes.contains(&older)
            && let (Some(proxy), Some(faults)) = (&self.seats[index].proxy, self.faults.as_mut())
        {
            faults.let_go(
                proxy,
                Note::from(let_go),
                (&mut self.tape, &mut self.nemesis),
            );
            self.held_writes.remove(&older);
        }
        if let Some((_, since)) = self.seats[index].job.as_mut() {
            *since = Instant::now();
        }
        Ok(())
    }

    /// Resumes `name` with `words` on the timeline, and counts its job's time from now:
    /// the time it was held is not its own.
    fn resume_to_write(&mut self, name: &str, words: String) -> Result<()> {
        self.play_now((Fault::Resume, name, How::default()), move |_| {
            Note::from(words)
        })?;
        if let Some(seat) = self.seats.iter_mut().find(|s| s.client.name == name)
            && let Some((_, since)) = seat.job.as_mut()
        {
            *since = Instant::now();
        }
        Ok(())
    }

    /// Has `name` answered `job` (or died)?
    fn done_with(&self, name: &str, job: i64) -> bool {
        !self.seats.iter().any(|s| {
            s.client.name == name
                && s.client.is_running()
                && s.job.is_some_and(|(held, _)| held == job)
        })
    }

    /// Whether what waits for `who`'s answer to `job` goes now: `Some(true)` once it answered
    /// (or died), `Some(false)` once `until` has passed without, `None` while it waits.
    fn time_to_go(&self, who: &str, job: i64, until: Instant) -> Option<bool> {
        let answered = self.done_with(who, job);
        (answered || Instant::now() >= until).then_some(answered)
    }

    /// Lets the held retry go once the newer holder has answered its job (or died), or
    /// [`HOLD_AT_MOST`] has passed.
    pub(super) fn let_the_retry_go(&mut self) -> Result<()> {
        let Some(held) = &self.retry_held else {
            return Ok(());
        };
        let Some(answered) = self.time_to_go(&held.newer, held.newer_job, held.until) else {
            return Ok(());
        };
        let Some(held) = self.retry_held.take() else {
            return Ok(());
        };
        let (older, newer) = (held.older, held.newer);
        let Some(index) = self.seats.iter().position(|s| s.client.name == older) else {
            return Ok(());
        };
        let after = answered_or_not(&newer, answered);
        let (resume, let_go) = match held.order {
            Order::Retry => (
                format!("resumes {older}, its retry after {newer}'s write ({after})"),
                format!("lets {older}'s retry go, after {newer}'s write ({after})"),
            ),
            Order::Natural => {
                let what = self.aimed.held_what(&older);
                (
                    format!("resumes {older}, after {newer}'s write ({after}): the natural order"),
                    format!(
                        "lets {older}'s held {what} go, after {newer}'s write ({after}): the \
                         natural order"
                    ),
                )
            }
        };
        self.release_retry(index, resume, let_go)
    }

    /// The worst order ends: the newer holder's held write goes once the older holder has
    /// answered its job (or died), or [`HOLD_AT_MOST`] has passed — and the fault follows
    /// the newer holder's job to its next write ([`Run::follow_the_newer`]). A newer write
    /// that does not come within its patience, or a job answered without one, ends it too:
    /// the older write stays held for another holder to come.
    pub(super) fn end_overtake(&mut self) -> Result<()> {
        let Some(overtake) = &self.overtaking else {
            return Ok(());
        };
        if !overtake.held {
            let waited = self.time_to_go(&overtake.newer, overtake.newer_job, overtake.until);
            let Some(answered) = waited else {
                return Ok(());
            };
            let Some(overtake) = self.overtaking.take() else {
                return Ok(());
            };
            let (newer, job) = (&overtake.newer, overtake.newer_job);
            let why = if answered {
                format!("{newer} answered job {job} with no write to hold")
            } else {
                format!(
                    "{newer} sent no write that would change the records within {}",
                    human(aim::patience(self.setup.init.lease_ms))
                )
            };
            let held = self.what_is_held(&overtake.older);
            self.let_the_newer_write(&overtake, format!("{why}: {held} stays held"));
            return Ok(());
        }
        let Some(answered) = self.time_to_go(&overtake.older, overtake.job, overtake.until) else {
            return Ok(());
        };
        let Some(overtake) = self.overtaking.take() else {
            return Ok(());
        };
        let name = overtake.newer.clone();
        let after = answered_or_not(&overtake.older, answered);
        self.let_the_newer_write(&overtake, format!("lets {name}'s write go ({after})"));
        let running = (self.seats.iter()).any(|s| s.client.name == name && s.client.is_running());
        if let (Some(follow), true) = (overtake.follow_the_newer, running) {
            self.follow_the_newer(follow, &name, overtake.newer_job)?;
        }
        Ok(())
    }

    /// The newer holder's proxy holds its writes no more: the one it held goes now (its
    /// hold's end recorded, in `words`), or, none held yet, the next one goes unheld (and
    /// `words` say why).
    fn let_the_newer_write(&mut self, overtake: &Overtake, words: String) {
        let Some(seat) = self.seats.iter().find(|s| s.client.name == overtake.newer) else {
            return;
        };
        let Some(proxy) = &seat.proxy else {
            return;
        };
        if overtake.held
            && let Some(faults) = self.faults.as_mut()
        {
            faults.let_go(
                proxy,
                Note::from(words),
                (&mut self.tape, &mut self.nemesis),
            );
            self.newer_let_go.insert(overtake.newer.clone());
            return;
        }
        proxy.clear(Direction::Up);
        self.note(crate::nemesis::LANE, What::Output, words);
    }
}

/// Why a held client goes on: `who` answered, or did not within [`HOLD_AT_MOST`].
fn answered_or_not(who: &str, answered: bool) -> String {
    if answered {
        format!("{who} answered")
    } else {
        format!("{who} did not answer within {}", human(HOLD_AT_MOST))
    }
}

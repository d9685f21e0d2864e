//! One run of lab 8's delayed write: A takes the lock, checks it, sends its write; the
//! proxy on A's path to the store holds the write while A's lease runs out and B takes the
//! lock and writes; then the nemesis lifts the hold and A's write arrives. Both are steps of
//! the story's schedule, played by the one player.

use anyhow::{Result, bail};

use super::Plan;
use super::scene::{HOLD_WORDS, Scene, net_step};
use super::verdict::RunVerdict;
use crate::connect::Backend;
use crate::events::{Kind, What};
use crate::labs::runner::Run;
use crate::nemesis::schedule::{Anchor, How, Schedule};
use crate::nemesis::{Fault, Note};
use crate::proxy::{self, Proxy};
use crate::store::Store;
use crate::worker::holder::{AfterWrite, BeforeWrite};

/// The story's faults: the hold on A's path to the store at once (before A is told to
/// write), and its heal once B has written.
fn schedule() -> Schedule {
    let b_wrote = Anchor::on("B", Kind::Wrote, 1);
    Schedule::done_so(vec![
        net_step(Fault::Hold, "A→store", None, How::default()),
        net_step(Fault::Heal, "A→store", Some(b_wrote), How::default()),
    ])
}

/// Plays the story once, fenced or not, and reads the verdict back.
pub(super) fn play(plan: &Plan, run: &Run, fenced: bool, store: &mut Store) -> Result<RunVerdict> {
    let (redis_url, store_url) = (run.url(Backend::Redis), run.url(Backend::Postgres));
    let at = crate::labs::step::network::before_run(fenced);
    let story = ("delayed-write", "the delayed write");
    let to_store = Proxy::start("A→store", proxy::upstream_of(store_url)?)?;
    let mut scene = Scene::open(plan, run, story, fenced, at, (&to_store, store_url, &[]))?;
    let a_urls = (redis_url, scene.url_through.as_str());
    let a_script = scene.holder(
        "A",
        a_urls,
        false,
        (BeforeWrite::WorkUntilToldThenCheck, AfterWrite::Release),
    );
    let (mut a, _) = scene.start_a(a_script)?;
    let mut faults = scene.faults(&schedule(), &[&to_store], |cue, looks| {
        match cue.action.fault {
            Fault::Hold => Note::from(HOLD_WORDS),
            _ => looks.healed("the proxy lets A's write go"),
        }
    });
    let checked = scene.hold_a_write(&mut faults, &mut a)?;
    if let What::Checked(check) = &checked.what
        && check.still_ours != Some(true)
    {
        bail!("A's lock had run out before A checked it: use a longer --ttl on a busy machine");
    }
    // B comes once A's write is on its way: it waits for A's key to expire.
    let b = scene.spawn_b()?;

    // The write waits in the proxy until B has written.
    scene.play_out(&mut faults, &a, |_| Ok(()))?;
    scene.end((a, b), store, false)
}

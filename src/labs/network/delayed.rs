//! One run of lab 8's delayed write: A takes the lock, checks it, sends its write; the
//! proxy on A's path to the store holds the write while A's lease runs out and B takes the
//! lock and writes; then the nemesis lifts the hold and A's write arrives.

use anyhow::{Result, bail};

use super::Plan;
use super::scene::Scene;
use super::verdict::RunVerdict;
use crate::connect::Backend;
use crate::events::What;
use crate::labs::runner::Run;
use crate::store::Store;
use crate::worker::holder::{AfterWrite, BeforeWrite};

/// Plays the story once, fenced or not, and reads the verdict back.
pub(super) fn play(plan: &Plan, run: &Run, fenced: bool, store: &mut Store) -> Result<RunVerdict> {
    let (redis_url, store_url) = (run.url(Backend::Redis), run.url(Backend::Postgres));
    let at = crate::labs::step::network::before_run(fenced);
    let story = ("delayed-write", "the delayed write");
    let mut scene = Scene::open(plan, run, story, fenced, at, ("A→store", store_url))?;
    let a_urls = (redis_url, scene.url_through.as_str());
    let a_script = scene.holder(
        "A",
        a_urls,
        false,
        (BeforeWrite::WorkUntilToldThenCheck, AfterWrite::Release),
    );
    let (mut a, _) = scene.start_a(a_script)?;
    let checked = scene.hold_a_write(&mut a)?;
    if let What::Checked(check) = &checked.what
        && check.still_ours != Some(true)
    {
        bail!("A's lock had run out before A checked it: use a longer --ttl on a busy machine");
    }
    // B comes once A's write is on its way: it waits for A's key to expire.
    let b = scene.spawn_b()?;

    // The write waits in the proxy until B has written.
    let seen = scene.until_b_wrote(&a, |_| Ok(()))?;
    scene.heal("the proxy lets A's write go", seen);
    scene.end((a, b), store, false)
}

//! The checkers of lab `etcd-vs-redis`: pure functions from the evidence the servers gave to the
//! facts its verdict states (see [`super`] for the rules every checker follows).

use super::{Finding, two_holders_queued};
use crate::lock::redis::Release;

/// How the lab struck the holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strike {
    /// SIGKILL mid-work.
    Kill,
    /// SIGSTOP past its TTL or lease, then SIGCONT.
    Freeze,
    /// Nobody was struck: the work outlasted the plain Redis TTL.
    Overrun,
}

/// What the lock's server said when each side let go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Releases<'a> {
    /// A Redis key: what each compare-and-delete found (None: the holder never released),
    /// and the owner value the waiter was granted.
    Redis {
        holder: Option<Release>,
        waiter_owner: Option<&'a str>,
        waiter: Option<Release>,
    },
    /// A lock the server queues waiters for (etcd, a Postgres advisory lock): whether the
    /// holder's release found the lock still its own.
    Queued { holder_kept: bool },
}

/// One lane's evidence: the lab's own stamps for the strike and the waiter's grant, the
/// backend's answer to "who holds it?" just before the resume, and the releases.
#[derive(Clone, Debug)]
pub struct Lane<'a> {
    pub strike: Strike,
    pub strike_t: u64,
    pub waiter_granted_t: Option<u64>,
    /// `holder`, `waiter`, `other` or `nobody`, as the backend answered before the resume.
    pub backend_saw: Option<&'a str>,
    pub releases: Releases<'a>,
}

/// Did the backend grant the lock to the waiter while the holder had not let go of it?
///
/// - Kill: a killed holder holds nothing. A waiter granted before the kill would be a broken
///   lock; its grant reached the lab before the lab even sent SIGKILL, so it happened before
///   the kill — arrival order can prove this one thing.
/// - Freeze: asked just before the resume, a backend that names the waiter proves it.
/// - Otherwise the releases decide: Redis's by what each compare-and-delete found (see
///   [`super::two_holders`]), a queueing server's by whether the holder's lock was gone.
pub fn two_holders(lane: &Lane) -> Finding {
    let granted = lane.waiter_granted_t.is_some();
    match lane.strike {
        Strike::Kill => {
            if lane.waiter_granted_t.is_some_and(|t| t < lane.strike_t) {
                Finding::Yes
            } else {
                Finding::No
            }
        }
        Strike::Freeze if lane.backend_saw == Some("waiter") => Finding::Yes,
        Strike::Freeze | Strike::Overrun => match &lane.releases {
            Releases::Redis {
                holder: Some(holder),
                waiter_owner,
                waiter,
            } => super::two_holders(holder, *waiter_owner, waiter.as_ref()),
            Releases::Redis { holder: None, .. } => Finding::Unknown,
            Releases::Queued { holder_kept } => two_holders_queued(*holder_kept, granted),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(strike: Strike, releases: Releases<'static>) -> Lane<'static> {
        Lane {
            strike,
            strike_t: 1_000,
            waiter_granted_t: Some(3_000),
            backend_saw: None,
            releases,
        }
    }

    fn redis(holder: Option<Release>, waiter: Option<Release>) -> Releases<'static> {
        Releases::Redis {
            holder,
            waiter_owner: Some("w"),
            waiter,
        }
    }

    #[test]
    fn a_kill_is_two_holders_only_if_the_waiter_got_in_before_it() {
        let mut killed = lane(Strike::Kill, Releases::Queued { holder_kept: false });
        assert_eq!(two_holders(&killed), Finding::No);
        killed.waiter_granted_t = Some(999);
        assert_eq!(two_holders(&killed), Finding::Yes);
        killed.waiter_granted_t = None;
        assert_eq!(two_holders(&killed), Finding::No);
    }

    #[test]
    fn a_backend_naming_the_waiter_before_the_resume_proves_two_holders() {
        let mut frozen = lane(Strike::Freeze, redis(Some(Release::Deleted), None));
        assert_eq!(
            two_holders(&frozen),
            Finding::No,
            "the holder deleted its own key"
        );
        frozen.backend_saw = Some("waiter");
        assert_eq!(two_holders(&frozen), Finding::Yes);
    }

    #[test]
    fn redis_releases_decide_or_say_unknown() {
        let found_waiter = redis(Some(Release::HeldBy("w".into())), None);
        assert_eq!(
            two_holders(&lane(Strike::Freeze, found_waiter)),
            Finding::Yes
        );
        let both_expired = redis(Some(Release::Gone), Some(Release::Gone));
        assert_eq!(
            two_holders(&lane(Strike::Freeze, both_expired)),
            Finding::Unknown
        );
        let waiter_kept = redis(Some(Release::Gone), Some(Release::Deleted));
        assert_eq!(
            two_holders(&lane(Strike::Overrun, waiter_kept)),
            Finding::No
        );
        let never_released = redis(None, Some(Release::Deleted));
        assert_eq!(
            two_holders(&lane(Strike::Freeze, never_released)),
            Finding::Unknown
        );
    }

    #[test]
    fn a_queueing_server_grants_the_waiter_only_once_the_holder_lost_its_lock() {
        let lost = Releases::Queued { holder_kept: false };
        assert_eq!(two_holders(&lane(Strike::Freeze, lost)), Finding::Yes);
        let kept = Releases::Queued { holder_kept: true };
        assert_eq!(two_holders(&lane(Strike::Overrun, kept)), Finding::No);
        let mut never_granted = lane(Strike::Freeze, Releases::Queued { holder_kept: false });
        never_granted.waiter_granted_t = None;
        assert_eq!(two_holders(&never_granted), Finding::No);
    }
}

//! etcd's lock ([`crate::lock::etcd`], lab 4): a key created under the client's lease,
//! kept alive by a keepalive; the key's create revision is a fencing token for free.

use anyhow::Result;

use super::{Desk, Done, Guard, Holding, LetGo, Point, Service};
use super::{claim_read_work_write, read_work_write};
use crate::lock::etcd::Acquired;

/// ❌ etcd-lease: etcd's lock, no token. A client frozen past its lease stops its
/// keepalive too; etcd revokes the lease, another client takes the lock, and the sleeper
/// wakes up and writes.
pub fn etcd_lease<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_etcd_lock(d, job, false)
}

/// ✅ etcd-fenced: the same lock; its key's create revision claims the record before the
/// read. Revisions only grow, cluster-wide: a late holder's claim, or its write, is refused.
pub fn etcd_fenced<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_etcd_lock(d, job, true)
}

fn under_etcd_lock<D: Desk + ?Sized>(d: &mut D, job: &D::Job, fenced: bool) -> Result<Done> {
    let name = d.lock_name(job);
    let mut lock = d.etcd(&name)?;
    let lease = lock.grant_lease(d.lease(), |_| {})?;
    let held = match lock.acquire_within(&lease, d.lock_wait())? {
        Acquired::Held(held) => held,
        _ => {
            let _ = lock.revoke(lease);
            return Ok(Done::NotTaken);
        }
    };
    let holding = Holding {
        token: Some(held.token),
        ..Holding::new(Service::Etcd, name)
    };
    d.at(job, Point::Locked(&holding))?;
    let done = if fenced {
        claim_read_work_write(d, job, held.token)
    } else {
        read_work_write(d, job, Guard::None)
    };
    let released = lock.release(lease, &held)?;
    d.at(job, Point::Released(&holding, LetGo::Etcd(released)))?;
    done
}

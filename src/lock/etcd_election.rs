//! Leader election on the queue recipe: etcd's election service (lab 10).
//!
//! An election is the lock recipe of [`super::etcd_queue`] kept for a long time: each
//! candidate puts a key of its own under the election's name, on its lease, and the oldest
//! key (lowest create revision) leads. etcd runs it inside the server (`Campaign` waits
//! until the candidate's key is the oldest, `Leader` reads the oldest key, `Resign` deletes
//! it), as it runs the lock.
//!
//! ```text
//!  election/7a3f  rev 41  ◀── leads: generation 41
//!  election/7a40  rev 42  ──waits (a campaign blocks until 41 is gone)
//! ```
//!
//! - **The generation** is the leader key's create revision: every new leader's is higher
//!   than every earlier leader's, so it fences like a lock's token.
//! - ❌ **A paused leader believes it still leads**: nothing in a frozen process notices
//!   that its lease ran out and another was elected. It carries on as leader.
//! - ✅ **The store refuses it** by generation, and ✅ **asking etcd** (`Leader`, or a
//!   transaction guarded on the key's create revision) tells it that it no longer leads.

use anyhow::{Context, Result, anyhow};
use etcd_client::Client;
use tokio::runtime::Runtime;

use super::etcd::Lease;
use crate::connect;

/// Leadership won: the leader key and its create revision, the generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub key: String,
    pub generation: i64,
    /// A revision at which etcd named this candidate leader (a `Leader` read just after the
    /// campaign returned); None if by then it named another.
    pub at: Option<i64>,
}

/// One candidate's connection to an election.
pub struct Candidate {
    runtime: Runtime,
    client: Client,
    /// The election's name: candidates' keys are `<name>/<lease in hex>`.
    pub name: String,
}

impl Candidate {
    pub fn connect(url: &str, name: &str) -> Result<Candidate> {
        let runtime = connect::etcd_runtime()?;
        let client = runtime.block_on(connect::etcd(url))?;
        Ok(Candidate {
            runtime,
            client,
            name: name.to_string(),
        })
    }

    /// Campaigns on `lease` with `value` (who we are), and waits until elected: etcd answers
    /// once our key is the oldest under the election's name.
    ///
    /// The campaign's answer carries the revision at which our key was *created*, not the
    /// one at which we were elected (etcd's election keeps the header of its put). So it
    /// asks `Leader` once elected: the revision of that answer is one at which we lead.
    pub fn campaign(&mut self, lease: &Lease, value: &str) -> Result<Leadership> {
        let answer = self
            .runtime
            .block_on(self.client.campaign(self.name.as_str(), value, lease.id))
            .context("etcd: campaigning")?;
        let leader = answer
            .leader()
            .ok_or_else(|| anyhow!("etcd: a campaign answered without a leader key"))?;
        let key = String::from_utf8_lossy(leader.key()).into_owned();
        let generation = leader.rev();
        let now = self
            .runtime
            .block_on(self.client.leader(self.name.as_str()))
            .context("etcd: asking who leads, once elected")?;
        let named_us = now.kv().is_some_and(|kv| kv.key() == key.as_bytes());
        let at = named_us.then(|| now.header().map(|h| h.revision()).unwrap_or_default());
        Ok(Leadership {
            key,
            generation,
            at,
        })
    }

    /// ✅ Who leads now, as etcd answers: the oldest key's name and create revision, or
    /// None if nobody campaigns. A woken leader asks this before it trusts its belief.
    pub fn leader_now(&mut self) -> Result<Option<(String, i64)>> {
        let answer = self
            .runtime
            .block_on(self.client.leader(self.name.as_str()));
        let answer = match answer {
            Ok(answer) => answer,
            // etcd answers "election: no leader" as an error when no key is left.
            Err(err) if err.to_string().contains("no leader") => return Ok(None),
            Err(err) => return Err(err).context("etcd: asking who leads"),
        };
        Ok(answer.kv().map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
            )
        }))
    }

    /// Steps down: deletes our key if it is still ours (a key gone with our lease is
    /// already no longer ours). True if it was there.
    pub fn resign(&mut self, leadership: &Leadership) -> Result<bool> {
        let answer = self
            .runtime
            .block_on(self.client.delete(leadership.key.as_str(), None))
            .context("etcd: resigning")?;
        Ok(answer.deleted() > 0)
    }
}

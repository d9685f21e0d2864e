//! A replica made to lag: frozen, and its replication link closed from its primary's side.
//!
//! On one machine a replica is never behind by itself: the stream reaches it within a
//! millisecond. Frozen alone it is not behind either — its kernel still takes the stream
//! into the socket buffer, and it reads it from there once thawed. Closed from the
//! primary's side (`CLIENT KILL TYPE replica`), the link carries nothing more: what the
//! primary takes from then on, the replica never gets unless the link comes back. That is
//! what lab 5 and chaos's failover play before they kill the primary: a `pause` of the
//! replica whose [`How::cut_link`](super::schedule::How::cut_link) is set.
//!
//! The freeze and the cut are one fault and one line of the history (a `frozen` event with
//! `links_closed`): the line can say how many links the cut closed only once it is done.

use anyhow::{Context, Result};

use crate::cluster;

/// Where a replica's link can be cut: the replica's name in the history, and its primary.
pub struct Link<'w> {
    pub replica: String,
    /// The primary's URL at the moment of the cut (after a failover, another node's).
    primary_url: Box<dyn Fn() -> String + 'w>,
}

impl<'w> Link<'w> {
    pub fn new(replica: &str, primary_url: impl Fn() -> String + 'w) -> Link<'w> {
        Link {
            replica: replica.into(),
            primary_url: Box::new(primary_url),
        }
    }

    /// Closes every replica link of the primary; returns how many it closed.
    pub fn cut(&self) -> Result<u64> {
        let mut on_primary = cluster::ask(&(self.primary_url)()).context("asking the primary")?;
        let closed = cluster::cut_replica_links(&mut on_primary)
            .context("cutting the replica's link (CLIENT KILL TYPE replica)")?;
        Ok(closed.max(0) as u64)
    }
}

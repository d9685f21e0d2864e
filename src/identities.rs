//! Identities nobody else has: the uids and gids lockslab runs untrusted code as when it
//! runs as root — a challenge's clients, a room seat's servers.

use std::fs;
use std::os::unix::fs::MetadataExt;

use anyhow::{Result, bail};
use nix::unistd::{Gid, Uid};

/// Where a run's users come from: 2,100,000,000 and the million above it. Far above the
/// ids accounts get (1000 up), the ranges `useradd` hands out as subordinate ids (100000 to
/// 600100000) and systemd's dynamic users (61184 to 65519); below 2^31, which some tools
/// still take for a signed number.
pub const CLIENT_UIDS: std::ops::Range<u32> = 2_100_000_000..2_101_000_000;

/// Where a room's seats' users come from (see `crate::servers::Seat`): the million after the
/// clients', so that a seat's server and a client can never be given the same number.
pub const SEAT_UIDS: std::ops::Range<u32> = 2_101_000_000..2_102_000_000;

/// `count` uids in `range`, each with the gid of the same number, that nothing on this
/// machine has: no account, no group, no subordinate-id range (`/etc/subuid`,
/// `/etc/subgid`), no process running as it — and no two alike.
pub fn free(range: std::ops::Range<u32>, count: usize) -> Result<Vec<(Uid, Gid)>> {
    let running: std::collections::BTreeSet<u32> = fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.uid())
                .collect()
        })
        .unwrap_or_default();
    let subordinate: Vec<(u64, u64)> = ["/etc/subuid", "/etc/subgid"]
        .iter()
        .filter_map(|file| fs::read_to_string(file).ok())
        .flat_map(|text| {
            text.lines()
                .filter_map(|line| {
                    let mut fields = line.split(':').skip(1);
                    let first: u64 = fields.next()?.trim().parse().ok()?;
                    let count: u64 = fields.next()?.trim().parse().ok()?;
                    Some((first, first + count))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let mut chosen: Vec<(Uid, Gid)> = Vec::with_capacity(count);
    for _ in 0..64 + 2 * count {
        if chosen.len() == count {
            break;
        }
        let draw = u32::from_str_radix(&crate::seed::os_hex(8), 16).unwrap_or(0);
        let id = range.start + draw % range.len() as u32;
        let taken = running.contains(&id)
            || chosen.iter().any(|(uid, _)| uid.as_raw() == id)
            || subordinate
                .iter()
                .any(|&(from, to)| (from..to).contains(&u64::from(id)))
            || !matches!(nix::unistd::User::from_uid(Uid::from_raw(id)), Ok(None))
            || !matches!(nix::unistd::Group::from_gid(Gid::from_raw(id)), Ok(None));
        if !taken {
            chosen.push((Uid::from_raw(id), Gid::from_raw(id)));
        }
    }
    if chosen.len() < count {
        bail!(
            "found no {count} free uids between {} and {}",
            range.start,
            range.end
        );
    }
    Ok(chosen)
}

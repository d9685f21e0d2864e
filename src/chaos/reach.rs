//! Which kinds of fault can reach which design, known before any server starts: a
//! restart needs a Redis, a leader-kill an etcd cluster, a lost reply a lock server
//! behind the fault proxy.

use crate::designs::Design;
use crate::nemesis::generate::FaultKind;

/// Can a fault of this kind reach this design at all?
pub fn reaches(design: Design, kind: FaultKind) -> bool {
    let d = design;
    match kind {
        FaultKind::Restart | FaultKind::RestartAof => d.uses_redis() || d.uses_masters(),
        FaultKind::LeaderKill => d.uses_etcd(),
        FaultKind::Failover => d.uses_redis(),
        FaultKind::LostReply | FaultKind::Cut => !d.uses_masters(),
        FaultKind::Clock => d.uses_redis() || d.uses_masters(),
        FaultKind::LeaderStall => d.uses_etcd(),
        _ => true,
    }
}

/// Why a kind cannot reach a design, in a few words.
fn why_not(design: Design, kind: FaultKind) -> String {
    let name = design.name();
    match kind {
        FaultKind::Restart | FaultKind::RestartAof => format!("{name} has no Redis"),
        FaultKind::LeaderKill => format!("{name} is not on etcd"),
        FaultKind::Failover => format!("{name} is not on one Redis"),
        FaultKind::LostReply | FaultKind::Cut => {
            "Redlock's masters are not behind the fault proxy".into()
        }
        FaultKind::Clock => format!("{name}'s locks do not expire on Redis"),
        FaultKind::LeaderStall => format!(
            "{name} is not on etcd (a Redis primary's stall under Sentinel: lab 5, \
             --scenario split-brain)"
        ),
        _ => "it reaches every design".into(),
    }
}

/// One line naming the asked-for kinds that cannot reach the design, and why, for a run
/// that plays the others; None when every one can.
pub fn unreached(design: Design, kinds: &[FaultKind]) -> Option<String> {
    let left = unreached_kinds(design, kinds);
    (!left.is_empty()).then(|| format!("Not played: {}.", left.join("; ")))
}

/// Each kind that cannot reach the design, with why: `restart (optimistic has no Redis)`.
pub fn unreached_kinds(design: Design, kinds: &[FaultKind]) -> Vec<String> {
    (kinds.iter())
        .filter(|kind| !reaches(design, **kind))
        .map(|kind| format!("{} ({})", kind.name(), why_not(design, *kind)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_that_cannot_reach_the_design_is_named_with_why() {
        let asked = [FaultKind::Kill, FaultKind::Restart];
        let line = unreached(Design::Optimistic, &asked).unwrap();
        assert_eq!(line, "Not played: restart (optimistic has no Redis).");
        assert_eq!(unreached(Design::RedisLock, &asked), None);
        let net = [FaultKind::LostReply, FaultKind::Cut];
        assert!(!net.iter().any(|k| reaches(Design::Redlock, *k)));
    }
}

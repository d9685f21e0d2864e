//! The etcd lock ([`lockslab::lock::etcd`]) against a real etcd cluster on hosts of its own
//! (issue 44): a lock call that waits on a member cut off from its majority is answered
//! "request timed out" — the cluster did not decide, it did not refuse — and the lock asks
//! again within its wait, as it does for "leader changed".

use std::sync::Arc;
use std::time::Duration;

use lockslab::hosts::{Hosts, Sides};
use lockslab::lock::etcd::{Acquired, EtcdLock};

/// The hosts, or a loud failure saying why this machine cannot make them (a partition test
/// skipped would pass without testing anything).
fn hosts(names: &[&str]) -> Hosts {
    Hosts::new(names).unwrap_or_else(|err| {
        panic!("this machine cannot make hosts, so this partition test cannot run: {err:#}")
    })
}

/// Client A on a host of its own beside member m1; the two cut off together from m2 and
/// m3, the majority. A's lock call goes to m1, which cannot commit A's key: its proposal
/// times out. Once the call was dropped so, the partition heals, and the same call —
/// still within its wait — takes the lock.
#[test]
fn a_lock_call_dropped_by_a_partitioned_member_is_asked_again_within_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let hosts = Arc::new(hosts(&["A", "m1", "m2", "m3"]));
    let etcd = hosts.start_etcd(&["m1", "m2", "m3"], dir.path()).unwrap();
    let m1 = etcd.on("m1").unwrap();
    let door = hosts.door("A", m1.client_addr).unwrap();
    let mut lock = EtcdLock::connect(&door.http_url(), "lockslab:test:partitioned").unwrap();
    // A lease that outlives the partition by far: the call must end on its own answer,
    // not because the heartbeat gave the lease up.
    let lease = lock.grant_lease(Duration::from_secs(60), |_| {}).unwrap();
    let dropped = lock.dropped_calls();

    let minority = Sides::new(&[&["A", "m1"], &["m2", "m3"]]);
    hosts.partition(&minority).unwrap();
    let waiting = std::thread::spawn(move || {
        let answer = lock.acquire_within(&lease, Duration::from_secs(90));
        (answer, lock, lease)
    });
    // Heal once m1 has answered the call with something other than a lock: a dropped call.
    let said = {
        let mut said = Vec::new();
        for _ in 0..900 {
            said = dropped.lock().unwrap().clone();
            if !said.is_empty() || waiting.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        said
    };
    hosts.heal().unwrap();
    let (answer, mut lock, lease) = waiting.join().unwrap();
    let answer = answer.unwrap_or_else(|err| {
        panic!("the lock call gave up on an answer the cluster did not decide: {err:#}")
    });
    assert!(
        said.iter().any(|words| words.contains("request timed out")),
        "m1 cut off from its majority says its proposal timed out: {said:?}"
    );
    let Acquired::Held(held) = answer else {
        panic!("asked again once healed, the call takes the free lock: {answer:?}");
    };
    assert!(held.token > 0);
    assert!(lock.release(lease, &held).unwrap());
}

//! The fenced store's rules, against a real Postgres: what each one accepts when a token
//! source hands the same token out twice.

mod common;

use common::servers;
use lockslab::store::{FenceRule, Outcome, Store};

fn store() -> (Store, String) {
    let mut store = Store::connect(&servers().postgres).unwrap();
    store.prepare().unwrap();
    let run_id = format!("store-test-{}-{}", std::process::id(), rand_suffix());
    (store, run_id)
}

fn rand_suffix() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        % 1_000_000_007
}

#[test]
fn a_reissued_token_from_another_holder_is_refused_and_a_holder_may_write_twice() {
    let (mut store, run) = store();
    let write = |store: &mut Store, who: &str, token: i64| {
        store.write(&run, "r", who, &format!("{who}'s result"), Some(token))
    };
    assert_eq!(write(&mut store, "A", 3), Outcome::Accepted);
    assert_eq!(
        write(&mut store, "A", 3),
        Outcome::Accepted,
        "A again, same token"
    );
    assert_eq!(
        write(&mut store, "B", 3),
        Outcome::Rejected,
        "B with A's token"
    );
    assert_eq!(
        write(&mut store, "B", 2),
        Outcome::Rejected,
        "a lower token"
    );
    assert_eq!(
        write(&mut store, "B", 4),
        Outcome::Accepted,
        "a higher token"
    );
    assert_eq!(
        write(&mut store, "A", 3),
        Outcome::Rejected,
        "A after B's higher token"
    );
    let back = store.read_back(&run, "r").unwrap();
    assert_eq!(back.attempts.len(), 6);
    assert_eq!(
        back.attempts.iter().filter(|a| a.accepted).count(),
        3,
        "{:?}",
        back.attempts
    );
    store.forget_run(&run).unwrap();
}

#[test]
fn the_loose_rule_accepts_a_reissued_token_twice() {
    let (mut store, run) = store();
    let write = |store: &mut Store, who: &str, token: i64| {
        store.write_under(FenceRule::NotLower, &run, "r", who, "x", Some(token))
    };
    assert_eq!(write(&mut store, "A", 3), Outcome::Accepted);
    assert_eq!(
        write(&mut store, "B", 3),
        Outcome::Accepted,
        "the reissue gets through"
    );
    assert_eq!(write(&mut store, "A", 2), Outcome::Rejected);
    store.forget_run(&run).unwrap();
}

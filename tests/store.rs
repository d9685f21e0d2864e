//! The fenced store's rules, against a real Postgres: what each one does when a token
//! source hands the same token out twice (in both orders of the two writes), what a token
//! from the store's own sequence does instead, and lab 6's compare-and-set by lock value.

use crate::common;

use common::servers;
use lockslab::store::{FenceRule, Outcome, ReadBack, Store};

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

/// `who` writes its result to `resource` under `rule` with `token`.
fn write(
    store: &mut Store,
    run: &str,
    rule: FenceRule,
    resource: &str,
    who: &str,
    token: i64,
) -> Outcome {
    store.write_under(
        rule,
        run,
        resource,
        who,
        &format!("{who}'s result"),
        Some(token),
    )
}

fn accepted(back: &ReadBack) -> Vec<(String, bool)> {
    back.attempts
        .iter()
        .map(|a| (a.writer.clone(), a.accepted))
        .collect()
}

#[test]
fn a_holder_may_write_twice_and_a_lower_token_is_refused() {
    let (mut store, run) = store();
    let rule = FenceRule::default();
    assert_eq!(rule, FenceRule::NotLower, "the store's rule is >=");
    assert_eq!(
        write(&mut store, &run, rule, "r", "A", 3),
        Outcome::Accepted
    );
    assert_eq!(
        write(&mut store, &run, rule, "r", "A", 3),
        Outcome::Accepted,
        "A again, same token"
    );
    assert_eq!(
        write(&mut store, &run, rule, "r", "B", 4),
        Outcome::Accepted,
        "a higher token"
    );
    assert_eq!(
        write(&mut store, &run, rule, "r", "A", 3),
        Outcome::Rejected,
        "A after B's 4"
    );
    let back = store.read_back(&run, "r").unwrap();
    assert_eq!(back.final_writer.as_deref(), Some("B"));
    assert_eq!(back.attempts.len(), 4);
    store.forget_run(&run).unwrap();
}

/// A holds token 3; the counter went back and B, the rightful holder now, drew 3 too.
/// "An equal token from another writer is a reissue" refuses whoever writes second: B's
/// write when A's stale one came first.
#[test]
fn the_same_holder_rule_refuses_whoever_writes_second_with_a_reissued_token() {
    let (mut store, run) = store();
    let rule = FenceRule::HigherOrSameHolder;

    // The rightful holder first: the stale write is refused.
    assert_eq!(
        write(&mut store, &run, rule, "b-first", "B", 3),
        Outcome::Accepted
    );
    assert_eq!(
        write(&mut store, &run, rule, "b-first", "A", 3),
        Outcome::Rejected
    );
    let back = store.read_back(&run, "b-first").unwrap();
    assert_eq!(back.final_writer.as_deref(), Some("B"));
    assert_eq!(accepted(&back), [("B".into(), true), ("A".into(), false)]);

    // The stale holder first: the rightful holder is refused, and A's result stands.
    assert_eq!(
        write(&mut store, &run, rule, "a-first", "A", 3),
        Outcome::Accepted
    );
    assert_eq!(
        write(&mut store, &run, rule, "a-first", "B", 3),
        Outcome::Rejected
    );
    let back = store.read_back(&run, "a-first").unwrap();
    assert_eq!(back.final_writer.as_deref(), Some("A"));
    assert_eq!(accepted(&back), [("A".into(), true), ("B".into(), false)]);
    store.forget_run(&run).unwrap();
}

#[test]
fn not_lower_accepts_a_reissued_token_in_either_order() {
    let (mut store, run) = store();
    let rule = FenceRule::NotLower;
    assert_eq!(
        write(&mut store, &run, rule, "b-first", "B", 3),
        Outcome::Accepted
    );
    assert_eq!(
        write(&mut store, &run, rule, "b-first", "A", 3),
        Outcome::Accepted,
        "the stale write gets through"
    );
    assert_eq!(
        store
            .read_back(&run, "b-first")
            .unwrap()
            .final_writer
            .as_deref(),
        Some("A")
    );
    assert_eq!(
        write(&mut store, &run, rule, "a-first", "A", 3),
        Outcome::Accepted
    );
    assert_eq!(
        write(&mut store, &run, rule, "a-first", "B", 3),
        Outcome::Accepted
    );
    assert_eq!(
        store
            .read_back(&run, "a-first")
            .unwrap()
            .final_writer
            .as_deref(),
        Some("B")
    );
    store.forget_run(&run).unwrap();
}

/// The fix is the source: tokens from a sequence in the store's own database are never
/// handed out twice, so the stale holder's token is lower and B's result stands in both
/// orders, under the store's own rule.
#[test]
fn tokens_from_the_stores_sequence_keep_the_rightful_result_in_either_order() {
    let (mut store, run) = store();
    let sequence = format!("lockslab_store_test_{}", rand_suffix());
    store.create_token_sequence(&sequence).unwrap();
    let a = store.next_token(&sequence).unwrap();
    let b = store.next_token(&sequence).unwrap();
    assert!(b > a, "{a} then {b}");
    let rule = FenceRule::default();

    assert_eq!(
        write(&mut store, &run, rule, "b-first", "B", b),
        Outcome::Accepted
    );
    assert_eq!(
        write(&mut store, &run, rule, "b-first", "A", a),
        Outcome::Rejected
    );
    assert_eq!(
        store
            .read_back(&run, "b-first")
            .unwrap()
            .final_writer
            .as_deref(),
        Some("B")
    );

    assert_eq!(
        write(&mut store, &run, rule, "a-first", "A", a),
        Outcome::Accepted
    );
    assert_eq!(
        write(&mut store, &run, rule, "a-first", "B", b),
        Outcome::Accepted
    );
    assert_eq!(
        write(&mut store, &run, rule, "a-first", "A", a),
        Outcome::Rejected,
        "A again, after B"
    );
    assert_eq!(
        store
            .read_back(&run, "a-first")
            .unwrap()
            .final_writer
            .as_deref(),
        Some("B")
    );
    store.forget_run(&run).unwrap();
    Store::connect(&servers().postgres)
        .unwrap()
        .drop_token_sequence(&sequence)
        .unwrap();
}

/// antirez's compare-and-set by random value: B's claim replaced A's, so A's late write is
/// refused. Kleppmann's reply: a claim has no order, and A's claim arriving late (A paused
/// between its grant and its claim) replaces B's: A's stale write is taken, B's refused.
#[test]
fn a_claim_by_lock_value_refuses_a_replaced_claim_and_takes_a_late_one() {
    let (mut store, run) = store();
    let (a, b) = ("a-random-value", "b-random-value");

    assert!(store.claim(&run, "claimed", "A", a));
    assert!(store.claim(&run, "claimed", "B", b));
    assert_eq!(
        store.write_if_claimed(&run, "claimed", "B", "B's result", b),
        Outcome::Accepted
    );
    assert_eq!(
        store.write_if_claimed(&run, "claimed", "A", "A's result", a),
        Outcome::Rejected
    );
    let back = store.read_back(&run, "claimed").unwrap();
    assert_eq!(back.final_writer.as_deref(), Some("B"));
    assert_eq!(accepted(&back), [("B".into(), true), ("A".into(), false)]);

    assert!(store.claim(&run, "late-claim", "B", b));
    assert_eq!(
        store.write_if_claimed(&run, "late-claim", "B", "B's result", b),
        Outcome::Accepted
    );
    assert!(store.claim(&run, "late-claim", "A", a));
    assert_eq!(
        store.write_if_claimed(&run, "late-claim", "A", "A's result", a),
        Outcome::Accepted
    );
    assert_eq!(
        store.write_if_claimed(&run, "late-claim", "B", "B's result", b),
        Outcome::Rejected
    );
    let back = store.read_back(&run, "late-claim").unwrap();
    assert_eq!(back.final_writer.as_deref(), Some("A"));
    assert_eq!(
        accepted(&back),
        [("B".into(), true), ("A".into(), true), ("B".into(), false)]
    );
    store.forget_run(&run).unwrap();
}

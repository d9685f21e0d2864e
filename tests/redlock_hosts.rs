//! Lab 6's `partition` scenario (issue 44): five real Redis masters and two clients, each
//! on a host of its own (network namespaces), cut apart by real partitions. What each
//! master holds is read back from the master itself. These tests need user namespaces:
//! where the kernel refuses them the lab fails, and so does the test — loudly.

use crate::common;

use std::process::Stdio;

use common::*;
use lockslab::check::redlock::MasterState;

/// The masters' read-back recorded in the scenario `part`.
fn read_back(events: &[Event], part: &str) -> Vec<MasterState> {
    (events.iter())
        .find_map(|e| match &e.what {
            What::HolderNow(h) if e.part.scenario.as_deref() == Some(part) => h.masters.clone(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no read-back of the masters in {part}"))
}

/// Who holds the key on each master, in order (`-` for no key).
fn holders(states: &[MasterState]) -> Vec<String> {
    (states.iter())
        .map(|s| {
            assert!(
                s.answered,
                "{} did not answer over its socket: {s:?}",
                s.master
            );
            s.holder.clone().unwrap_or_else(|| "-".into())
        })
        .collect()
}

/// `lockslab redlock partition --json` with `flags`, in a temporary directory of its own,
/// which it must leave empty: its events and its verdict.
fn partition_run(flags: &[&str]) -> (Vec<Event>, serde_json::Value) {
    let tmp = tempfile::tempdir().unwrap();
    let mut args = vec!["redlock", "partition", "--json"];
    args.extend(flags);
    let output = lockslab(&args)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "lockslab redlock partition failed (a machine without user namespaces cannot run \
         this test; it is not skipped): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        std::fs::read_dir(tmp.path()).unwrap().next().is_none(),
        "the hosts' directory is gone"
    );
    events_and_verdict(&String::from_utf8_lossy(&output.stdout))
}

#[test]
fn a_quorum_survives_a_cut_minority_and_a_3_2_split_grants_one_side_only() {
    // A lease long enough that the read-back "right after" each round still finds the keys
    // on a machine busy with the rest of the suite (at the default 2s, under load it did not).
    let (events, verdict) = partition_run(&["--ttl", "10s"]);
    // Cut from m4 and m5, A still set the key on the three it reached: a quorum.
    assert_eq!(
        holders(&read_back(&events, "partition-cut")),
        ["A", "A", "A", "-", "-"]
    );
    // Split 3/2, each client asking while it lasts: A's side holds, B's side holds nothing (its
    // failed round released m4 and m5).
    assert_eq!(
        holders(&read_back(&events, "partition-split")),
        ["A", "A", "A", "-", "-"]
    );
    let rows = verdict["scenarios"].as_array().unwrap();
    let row = |name: &str| rows.iter().find(|r| r["name"] == name).unwrap();
    assert_eq!(row("partition-cut")["granted"], true);
    assert_eq!(row("partition-split")["granted"], false, "B's side, 2 of 5");
    assert_eq!(row("partition-split")["two_holders"], false);
    for part in ["partition-cut", "partition-split"] {
        let cut = (events.iter())
            .find(|e| e.kind() == Kind::NetFault && e.part.scenario.as_deref() == Some(part));
        assert!(cut.is_some(), "{part} played its partition");
    }
}

/// The events of scenario `part`, in order.
fn part_of<'a>(events: &'a [Event], part: &str) -> Vec<&'a Event> {
    (events.iter())
        .filter(|e| e.part.scenario.as_deref() == Some(part))
        .collect()
}

/// The split landing in the middle of A's round, timed by the player from A's grant events:
/// it comes right after the grant it waited for (m2's, then m3's) and before A's round
/// ends. One grant short of its quorum, A is refused and its release takes back m1 and m2,
/// and B, with the majority of the masters, is granted; with its quorum already, A holds,
/// and B is refused by A's key on m3, on B's own side.
#[test]
fn a_split_in_the_middle_of_a_round_grants_whoever_has_a_quorum_when_it_lands() {
    // A per-instance timeout a busy machine's answers stay well within (the masters'
    // connections are opened before each round).
    let (events, verdict) = partition_run(&["--ttl", "10s", "--instance-timeout", "200ms"]);
    let rows = verdict["scenarios"].as_array().unwrap();
    let row = |name: &str| {
        (rows.iter())
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no scenario {name} in {verdict}"))
    };
    for (part, after, holders_then) in [
        (
            "partition-split-before-quorum",
            "m2",
            ["-", "-", "B", "B", "B"],
        ),
        (
            "partition-split-after-quorum",
            "m3",
            ["A", "A", "A", "-", "-"],
        ),
    ] {
        let seen = part_of(&events, part);
        let cut = (seen.iter())
            .position(|e| e.kind() == Kind::NetFault)
            .unwrap_or_else(|| panic!("{part}: no partition played"));
        // The split came on A's grant from `after`, before A's round ended.
        let What::Granted(grant) = &seen[cut - 1].what else {
            panic!(
                "{part}: the split did not follow a grant: {:?}",
                seen[cut - 1]
            );
        };
        assert_eq!(grant.answer.master, after, "{part}");
        let a_round = (seen.iter())
            .position(|e| e.worker == "A" && matches!(e.kind(), Kind::Acquired | Kind::GaveUp))
            .unwrap();
        assert!(cut < a_round, "{part}: the split landed after A's round");
        let step = &row(part)["schedule"][0];
        assert_eq!(step["fault"], "partition", "{part}: {step}");
        assert_eq!(step["after"]["event"], "granted", "{part}: {step}");
        assert_eq!(
            holders(&read_back(&events, part)),
            holders_then,
            "{part}: the masters, read back over their sockets while the split lasted"
        );
        assert_eq!(row(part)["two_holders"], false, "{part}");
        assert_eq!(
            row(part)["left_after_release"],
            serde_json::json!([]),
            "{part}"
        );
        assert!(
            seen.iter().any(|e| e.kind() == Kind::NetHealed),
            "{part}: the split healed"
        );
    }
    let before = &row("partition-split-before-quorum")["rounds"];
    assert_eq!(before[0]["held"], false, "A, 2 of 5: {before}");
    let released: Vec<&str> = (before[0]["released"].as_array().unwrap().iter())
        .filter(|a| a["reply"] == "deleted")
        .map(|a| a["master"].as_str().unwrap())
        .collect();
    assert_eq!(released, ["m1", "m2"], "A's release took back what it got");
    assert_eq!(
        row("partition-split-before-quorum")["granted"],
        true,
        "B, 3 of 5"
    );
    let after = &row("partition-split-after-quorum")["rounds"];
    assert_eq!(after[0]["held"], true, "A, 3 of 5: {after}");
    assert_eq!(
        after[1]["answers"][2]["reply"], "refused",
        "m3 holds A's key: {after}"
    );
    assert_eq!(
        row("partition-split-after-quorum")["granted"],
        false,
        "B, 2 of 5"
    );
}

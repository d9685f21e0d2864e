//! The schedule's language and its clock, without a process or a server.

use super::*;

fn step(at_ms: u64, fault: Fault, target: &str, duration_ms: Option<u64>) -> Step {
    Step {
        at_ms,
        after: None,
        fault,
        target: target.into(),
        duration_ms,
    }
}

#[test]
fn a_schedule_reads_and_writes_the_json_it_documents() {
    let text = r#"[{"at_ms":200,"fault":"pause","target":"A","duration_ms":3000},
                   {"at_ms":900,"fault":"restart","target":"redis"}]"#;
    let schedule: Schedule = serde_json::from_str(text).unwrap();
    assert_eq!(
        schedule.steps(),
        &[
            step(200, Fault::Pause, "A", Some(3000)),
            step(900, Fault::Restart, "redis", None)
        ]
    );
    let again: Schedule = serde_json::from_str(&serde_json::to_string(&schedule).unwrap()).unwrap();
    assert_eq!(again, schedule);
}

/// A lost reply reads by the name chaos prints (`lost-reply`) as well as by the one
/// the JSON writes (`drop_reply`), and writes back as `drop_reply` (the history's word).
#[test]
fn a_lost_reply_reads_by_either_name_and_writes_as_drop_reply() {
    for name in ["lost-reply", "drop_reply"] {
        let text = format!(r#"[{{"at_ms":300,"fault":"{name}","target":"A→redis"}}]"#);
        let schedule: Schedule = serde_json::from_str(&text).unwrap();
        assert_eq!(schedule.steps()[0].fault, Fault::DropReply, "{name}");
        let written = serde_json::to_string(&schedule).unwrap();
        assert!(written.contains(r#""fault":"drop_reply""#), "{written}");
    }
    assert!(
        serde_json::from_str::<Schedule>(r#"[{"at_ms":0,"fault":"lost_reply","target":"A"}]"#)
            .is_err()
    );
}

#[test]
fn a_timed_pause_becomes_a_pause_and_its_resume_in_time_order() {
    let schedule = Schedule::new(vec![
        step(900, Fault::Restart, "redis", None),
        step(200, Fault::Pause, "A", Some(3000)),
    ]);
    let actions = schedule.actions();
    let actions: Vec<(u64, Fault, &str)> = actions
        .iter()
        .map(|a| (a.at_ms, a.fault, a.target.as_str()))
        .collect();
    assert_eq!(
        actions,
        vec![
            (200, Fault::Pause, "A"),
            (900, Fault::Restart, "redis"),
            (3200, Fault::Resume, "A"),
        ]
    );
}

#[test]
fn the_player_hands_out_each_action_once_when_it_is_due() {
    let schedule = Schedule::new(vec![
        step(100, Fault::Pause, "A", Some(50)),
        step(120, Fault::Kill, "B", None),
    ]);
    let mut player = Player::new(&schedule);
    assert!(player.due(99).is_empty());
    assert_eq!(player.due(100).len(), 1);
    assert!(player.due(100).is_empty(), "handed out once");
    let late: Vec<Fault> = player.due(1_000).iter().map(|a| a.fault).collect();
    assert_eq!(late, vec![Fault::Kill, Fault::Resume]);
    assert!(player.done());
    assert_eq!(player.ends_at_ms(), 150);
}

#[test]
fn validation_names_what_is_wrong() {
    let workers = ["A", "B"];
    let servers = ["redis"];
    let check = |steps| Schedule::new(steps).validate(&workers, &servers);
    let message = |steps| format!("{:#}", check(steps).unwrap_err());

    assert!(check(vec![step(0, Fault::Pause, "A", Some(10))]).is_ok());
    assert!(message(vec![step(0, Fault::Kill, "C", None)]).contains("'C'"));
    assert!(message(vec![step(0, Fault::Restart, "A", None)]).contains("only a server"));
    assert!(
        message(vec![step(0, Fault::ClockStep, "redis", None)]).contains("only a worker's clock")
    );
    assert!(check(vec![step(0, Fault::ClockStep, "A", None)]).is_ok());
    assert!(message(vec![step(0, Fault::Kill, "A", Some(5))]).contains("takes no duration_ms"));
    assert!(
        message(vec![
            step(0, Fault::Pause, "A", Some(100)),
            step(50, Fault::Pause, "A", None)
        ])
        .contains("paused twice")
    );
    assert!(message(vec![step(0, Fault::Resume, "A", None)]).contains("without a pause"));
    assert!(
        message(vec![
            step(0, Fault::Kill, "A", None),
            step(10, Fault::Pause, "A", None)
        ])
        .contains("after it was killed")
    );
    // A server is never paused nor killed: it only restarts.
    let server_paused = message(vec![step(100, Fault::Pause, "redis", Some(900))]);
    assert!(server_paused.contains("only a client"), "{server_paused}");
    assert!(server_paused.contains("(A, B)"), "{server_paused}");
    assert!(message(vec![step(0, Fault::Kill, "redis", None)]).contains("only a client"));
}

fn after(
    worker: &str,
    event: impl Into<Kinds>,
    nth: u32,
    at_ms: u64,
    fault: Fault,
    target: &str,
) -> Step {
    Step {
        after: Some(Anchor::on(worker, event, nth)),
        ..step(at_ms, fault, target, None)
    }
}

fn event(worker: &str, what: crate::events::What, t_ms: u64) -> Event {
    let mut event = Event::new(worker, what, "");
    event.t_ms = t_ms;
    event
}

#[test]
fn an_anchored_step_reads_and_writes_json_and_nth_defaults_to_the_first() {
    let text = r#"[{"at_ms":5,"after":{"worker":"A","event":"acquired"},
                    "fault":"pause","target":"A","duration_ms":900}]"#;
    let schedule: Schedule = serde_json::from_str(text).unwrap();
    let anchored = Step {
        duration_ms: Some(900),
        ..after("A", Kind::Acquired, 1, 5, Fault::Pause, "A")
    };
    assert_eq!(schedule.steps(), &[anchored]);
    let again: Schedule = serde_json::from_str(&serde_json::to_string(&schedule).unwrap()).unwrap();
    assert_eq!(again, schedule);
    assert!(schedule.actions().is_empty(), "no time before its event");
}

#[test]
fn an_anchored_step_is_timed_from_the_nth_matching_event_and_its_resume_follows() {
    use crate::events::What;
    let mut pause = after("A", Kind::Acquired, 2, 10, Fault::Pause, "A");
    pause.duration_ms = Some(100);
    let schedule = Schedule::new(vec![pause, step(50, Fault::Kill, "B", None)]);
    let mut player = Player::new(&schedule);
    assert!(!player.done());
    player.observe(&event("B", What::Acquired(Default::default()), 20));
    player.observe(&event("A", What::Working, 25));
    player.observe(&event("A", What::Acquired(Default::default()), 30));
    assert_eq!(
        player.unplayed().len(),
        1,
        "A's first grant is not the second"
    );
    let kill: Vec<Fault> = player.due(60).iter().map(|a| a.fault).collect();
    assert_eq!(kill, vec![Fault::Kill]);
    player.observe(&event("A", What::Acquired(Default::default()), 70));
    assert!(player.unplayed().is_empty());
    assert!(player.due(79).is_empty());
    let pause = player.due(80);
    assert_eq!((pause[0].fault, pause[0].at_ms), (Fault::Pause, 80));
    assert_eq!(player.ends_at_ms(), 180);
    let resume = player.due(10_000);
    assert_eq!((resume[0].fault, resume[0].at_ms), (Fault::Resume, 180));
    assert!(player.done());
}

#[test]
fn a_resume_withdrawn_while_its_pause_waits_is_due_when_added_back() {
    let pause = step(10, Fault::Pause, "A", Some(100));
    let schedule = Schedule::new(vec![pause, step(50, Fault::Kill, "B", None)]);
    let mut player = Player::new(&schedule);
    assert_eq!(player.due(10)[0].fault, Fault::Pause);
    let resume = player
        .withdraw("A", Fault::Resume)
        .expect("the pause's resume");
    assert_eq!(resume.at_ms, 110);
    assert!(player.withdraw("A", Fault::Resume).is_none(), "only one");
    assert_eq!(player.due(200)[0].fault, Fault::Kill, "the rest stays");
    // The pause landed at 230: its resume is due its 100ms later.
    player.add(Action {
        at_ms: 330,
        ..resume
    });
    assert_eq!(player.ends_at_ms(), 330);
    assert!(player.due(329).is_empty());
    assert_eq!(player.due(330)[0].fault, Fault::Resume);
    assert!(player.done());
}

/// Once the run is over, the player names each step it never handed out by its place
/// in the schedule as written, and why: its event never came (and how many of its kind
/// did), or its time came after the run; a timed pause's resume is not a step.
#[test]
fn the_player_says_which_steps_never_played_and_why() {
    use crate::events::What;
    let pause = step(10, Fault::Pause, "B", Some(5_000));
    let schedule: Schedule = serde_json::from_value(serde_json::json!([
        {"at_ms": 900, "fault": "kill", "target": "C"},
        {"at_ms": 0, "after": {"worker": "A", "event": "read_record", "nth": 3},
         "fault": "kill", "target": "A"},
        serde_json::to_value(&pause).unwrap(),
    ]))
    .unwrap();
    let mut player = Player::new(&schedule);
    let read = || What::ReadRecord(Default::default());
    player.observe(&event("A", read(), 5));
    player.observe(&event("A", read(), 6));
    let handed: Vec<Option<usize>> = player.due(100).iter().map(|a| a.step).collect();
    assert_eq!(handed, vec![Some(2)], "the pause, by its place as written");
    assert_eq!(
        player.left(),
        vec![
            (
                0,
                "it was due at +900ms, and the run was over before".to_string()
            ),
            (
                1,
                "A's read_record #3 never came (A had reported 2)".to_string()
            ),
        ],
        "the pause's resume, still due, is not a step of its own"
    );
    let untouched = Player::new(&Schedule::new(vec![after(
        "B",
        Kind::Acquired,
        1,
        0,
        Fault::Kill,
        "B",
    )]));
    assert_eq!(
        untouched.left()[0].1,
        "B's acquired #1 never came (B had reported none)"
    );
}

#[test]
fn anchors_are_checked_and_a_schedule_shrinks_by_step_and_by_worker() {
    let bad = Schedule::new(vec![after("C", Kind::Acquired, 1, 0, Fault::Kill, "A")]);
    let message = format!("{:#}", bad.validate(&["A", "B"], &[]).unwrap_err());
    assert!(message.contains("'C'"), "{message}");
    let zeroth = Schedule::new(vec![after("A", Kind::Acquired, 0, 0, Fault::Kill, "A")]);
    assert!(zeroth.validate(&["A"], &[]).is_err());
    let schedule = Schedule::new(vec![
        after("B", Kind::Acquired, 1, 0, Fault::Pause, "A"),
        step(10, Fault::Kill, "B", None),
        step(20, Fault::Restart, "redis", None),
    ]);
    assert_eq!(schedule.without(0).steps().len(), 2);
    let no_b = schedule.without_worker("B");
    assert_eq!(no_b.steps(), &[step(20, Fault::Restart, "redis", None)]);
}

#[test]
fn an_anchor_on_several_kinds_is_timed_from_whichever_comes_first() {
    use crate::events::What;
    let text = r#"[{"at_ms":0,"after":{"worker":"W1","event":["lost","acquired"]},
                    "fault":"pause","target":"H","duration_ms":50}]"#;
    let schedule: Schedule = serde_json::from_str(text).unwrap();
    let either = Kinds::Any(vec![Kind::Lost, Kind::Acquired]);
    assert_eq!(
        schedule.steps()[0].after,
        Some(Anchor::on("W1", either.clone(), 1))
    );
    assert_eq!(
        serde_json::to_value(&schedule).unwrap()[0]["after"]["event"],
        serde_json::json!(["lost", "acquired"])
    );
    assert_eq!(
        schedule.steps()[0].when(),
        "0ms after W1's lost or acquired #1"
    );
    assert!(schedule.validate(&["H", "W1"], &[]).is_ok());
    let none = Schedule::new(vec![after(
        "W1",
        Kinds::Any(vec![]),
        1,
        0,
        Fault::Kill,
        "H",
    )]);
    assert!(none.validate(&["H", "W1"], &[]).is_err());

    let mut player = Player::new(&schedule);
    player.observe(&event("W1", What::Working, 10));
    player.observe(&event("H", What::Acquired(Default::default()), 20));
    assert_eq!(player.unplayed().len(), 1, "neither kind from W1 yet");
    player.observe(&event("W1", What::Acquired(Default::default()), 30));
    let pause = player.due(30);
    assert_eq!((pause[0].fault, pause[0].at_ms), (Fault::Pause, 30));
    player.observe(&event("W1", What::Acquired(Default::default()), 40));
    assert_eq!(player.due(10_000).len(), 1, "only the resume: counted once");
    assert!(player.done());
}

#[test]
fn a_single_kind_still_reads_and_writes_as_a_plain_string() {
    let anchor = Anchor::on("A", Kind::Working, 1);
    let json = serde_json::to_value(&anchor).unwrap();
    assert_eq!(json["event"], "working");
    let back: Anchor = serde_json::from_value(json).unwrap();
    assert_eq!(back, anchor);
}

/// "Once A is frozen and B has the lock": timed from the later of the two, each counted
/// on its own; with `or`, from the first.
#[test]
fn an_anchor_on_several_events_waits_for_all_of_them_or_any_of_them() {
    use crate::events::What;
    let text = r#"[{"at_ms":10,"after":{"worker":"A","event":"working",
                    "and":[{"worker":"B","event":"acquired"}]},
                    "fault":"resume","target":"A"}]"#;
    let both: Schedule = serde_json::from_str(text).unwrap();
    assert_eq!(
        both.steps()[0].when(),
        "10ms after A's working #1 and B's acquired #1"
    );
    let again: Schedule = serde_json::from_str(&serde_json::to_string(&both).unwrap()).unwrap();
    assert_eq!(again, both);
    let mut player = Player::new(&both);
    player.observe(&event("B", What::Acquired(Default::default()), 20));
    assert!(player.due(1_000).is_empty(), "A's point has not come");
    player.observe(&event("A", What::Working, 50));
    let resume = player.due(1_000);
    assert_eq!((resume[0].fault, resume[0].at_ms), (Fault::Resume, 60));

    let either = Schedule::new(vec![Step {
        after: Some(Anchor::on("A", Kind::Working, 1).or(Point::on("B", Kind::Acquired, 1))),
        ..step(10, Fault::Kill, "A", None)
    }]);
    let mut player = Player::new(&either);
    player.observe(&event("B", What::Acquired(Default::default()), 20));
    assert_eq!(player.due(1_000)[0].at_ms, 30, "B's grant alone will do");
    player.observe(&event("A", What::Working, 50));
    assert!(player.done() && player.due(10_000).is_empty(), "timed once");

    let mixed = Anchor::on("A", Kind::Working, 1)
        .and(Point::on("B", Kind::Acquired, 1))
        .or(Point::on("B", Kind::Lost, 1));
    let mixed = Schedule::new(vec![Step {
        after: Some(mixed),
        ..step(0, Fault::Kill, "A", None)
    }]);
    let message = format!("{:#}", mixed.validate(&["A", "B"], &[]).unwrap_err());
    assert!(message.contains("not both"), "{message}");
    let stranger = Schedule::new(vec![Step {
        after: Some(Anchor::on("A", Kind::Working, 1).and(Point::on("Z", Kind::Lost, 1))),
        ..step(0, Fault::Kill, "A", None)
    }]);
    assert!(stranger.validate(&["A", "B"], &[]).is_err());
}

/// An anchor with `within_ms` gives up then: the step is handed out as a miss, with the
/// points that did not come, and is named among those that did not play.
#[test]
fn an_anchor_that_does_not_come_in_time_is_a_miss() {
    use crate::events::What;
    let anchor = Anchor::on("A", Kind::Working, 1)
        .and(Point::on("B", Kind::Acquired, 1))
        .within(500);
    let schedule = Schedule::new(vec![Step {
        after: Some(anchor),
        ..step(0, Fault::Resume, "A", None)
    }]);
    let mut player = Player::new(&schedule);
    player.observe(&event("A", What::Working, 100));
    assert!(player.due_all(499).is_empty());
    let due = player.due_all(500);
    let [Due::Missed { item, why }] = due.as_slice() else {
        panic!("{due:?}")
    };
    assert_eq!(*item, Item::Step(0));
    assert_eq!(
        why,
        "its events did not all come by +500ms: B's acquired #1 never came (B had reported none)"
    );
    assert!(player.done());
    assert_eq!(player.left(), vec![(0, why.clone())]);
    player.observe(&event("B", What::Acquired(Default::default()), 600));
    assert!(player.due_all(10_000).is_empty(), "a miss stays a miss");
}

/// A probe reads and writes in the same array as the faults, is timed like a step (from
/// its anchor) and is handed out before a fault due at the same moment.
#[test]
fn a_probe_is_an_entry_of_the_schedule_asked_before_a_fault_due_with_it() {
    use crate::events::What;
    let text = r#"[{"at_ms":0,"after":{"worker":"A","event":"frozen"},
                    "fault":"restart","target":"redis"},
                   {"at_ms":0,"after":{"worker":"A","event":"frozen"},
                    "probe":{"ask":"pttl","key":"k"},"target":"redis"}]"#;
    let schedule: Schedule = serde_json::from_str(text).unwrap();
    assert_eq!(schedule.steps().len(), 1);
    assert_eq!(
        schedule.probes()[0].probe,
        crate::nemesis::probe::Question::Pttl { key: "k".into() }
    );
    let again: Schedule = serde_json::from_str(&serde_json::to_string(&schedule).unwrap()).unwrap();
    assert_eq!(again.probes(), schedule.probes());
    let mut player = Player::new(&schedule);
    assert!(!player.done());
    player.observe(&event("A", What::Frozen(Default::default()), 40));
    let due = player.due_all(40);
    assert!(
        matches!(
            due[0],
            Due::Probe {
                at_ms: 40,
                index: 0
            }
        ),
        "{due:?}"
    );
    assert!(matches!(&due[1], Due::Fault(a) if a.fault == Fault::Restart));
    assert!(player.done());
    let typo = r#"[{"at_ms":0,"probe":{"ask":"pttl","kye":"k"},"target":"redis"}]"#;
    let message = serde_json::from_str::<Schedule>(typo)
        .unwrap_err()
        .to_string();
    assert!(message.contains("unknown field `kye`"), "{message}");
}

/// How a fault is done sits beside the step's fields, is read back with it and kept
/// through sorting; a timed cut ends with its heal, as a timed pause with its resume.
#[test]
fn how_a_fault_is_done_travels_with_its_step_and_a_timed_cut_heals() {
    let text = r#"[{"at_ms":300,"fault":"cut","target":"A→redis","duration_ms":900,
                    "proxy":{"net":"black_hole"}},
                   {"at_ms":100,"fault":"clock_step","target":"A","by_ms":-30000}]"#;
    let schedule: Schedule = serde_json::from_str(text).unwrap();
    assert_eq!(
        schedule.how(0).proxy,
        Some(crate::proxy::NetFault::BlackHole)
    );
    assert_eq!(schedule.how(1).by_ms, Some(-30_000));
    let written = serde_json::to_string(&schedule).unwrap();
    assert!(
        written.contains(r#""duration_ms":900,"proxy":{"net":"black_hole"}"#),
        "{written}"
    );
    let sorted = schedule.and(&Schedule::default());
    assert_eq!(sorted.steps()[0].fault, Fault::ClockStep);
    assert_eq!(sorted.how(0).by_ms, Some(-30_000), "kept with its step");
    let actions: Vec<(u64, Fault)> = sorted
        .actions()
        .iter()
        .map(|a| (a.at_ms, a.fault))
        .collect();
    assert_eq!(
        actions,
        [
            (100, Fault::ClockStep),
            (300, Fault::Cut),
            (1200, Fault::Heal)
        ]
    );
    let typo = r#"[{"at_ms":0,"fault":"clock_step","target":"A","by":-5}]"#;
    let message = serde_json::from_str::<Schedule>(typo)
        .unwrap_err()
        .to_string();
    assert!(message.contains("unknown field `by`"), "{message}");
}

#[test]
fn a_lagging_replica_s_pause_says_it_cuts_the_link_and_reads_back_so() {
    let text = r#"[{"at_ms":0,"fault":"pause","target":"replica","cut_link":true},
                   {"at_ms":0,"fault":"pause","target":"A"}]"#;
    let schedule: Schedule = serde_json::from_str(text).unwrap();
    assert!(schedule.how(0).cut_link);
    assert!(
        schedule.how(1).is_plain(),
        "a plain pause writes no cut_link"
    );
    let written = serde_json::to_string(&schedule).unwrap();
    assert_eq!(written.matches("cut_link").count(), 1, "{written}");
    let again: Schedule = serde_json::from_str(&written).unwrap();
    assert_eq!(again, schedule);
}

use super::*;

/// A worker's line that arrived (and was stamped) before the lab's freeze is shown above
/// it, and the lab still receives it afterwards.
#[test]
fn a_lab_event_never_shows_above_a_worker_line_that_arrived_before_it() {
    let mut stage = Stage::new(Style {
        json: true,
        fancy: false,
    })
    .quiet();
    let mut said = Event::new("w2", What::Working, "working");
    said.t_ms = 0;
    stage.tx.send(Incoming::Event(Box::new(said))).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    stage.record(Event::new("lab", What::Freezing, "❄ SIGSTOP w2"));
    let order: Vec<(&str, u64)> = stage
        .log
        .iter()
        .map(|e| (e.worker.as_str(), e.t_ms))
        .collect();
    assert_eq!(order.len(), 2, "{order:?}");
    assert_eq!(order[0].0, "w2", "{order:?}");
    assert!(order.windows(2).all(|w| w[0].1 <= w[1].1), "{order:?}");
    let handed = stage
        .next(Duration::ZERO)
        .expect("the lab still gets w2's line");
    assert_eq!(handed.worker, "w2");
    assert_eq!(stage.log.len(), 2, "shown once only");
}

/// In `run_until`'s tick, the lab's observation (A's key expired) stays above a worker
/// line (B took the lock) that arrived while it looked, stamped no later than that line.
#[test]
fn what_a_tick_records_stays_above_a_line_that_arrived_during_it() {
    let mut stage = Stage::new(Style {
        json: true,
        fancy: false,
    })
    .quiet();
    let tx = stage.tx.clone();
    std::thread::sleep(Duration::from_millis(5));
    stage
        .pump(Duration::ZERO, &mut |stage: &mut Stage| {
            let mut said = Event::new("B", What::Working, "took the lock");
            said.t_ms = 3;
            tx.send(Incoming::Event(Box::new(said))).unwrap();
            stage.record(Event::new("redis", What::Freezing, "A's key has expired"));
            Ok(())
        })
        .unwrap();
    stage.drain();
    let order: Vec<(&str, u64)> = stage
        .log
        .iter()
        .map(|e| (e.worker.as_str(), e.t_ms))
        .collect();
    assert_eq!(order, [("redis", 3), ("B", 3)]);
}

//! A schedule's step in a few words, as every line of chaos names it: the schedule lines,
//! the failure, the steps that never played, the shrinker's progress.

use crate::nemesis::Fault;
use crate::nemesis::schedule::Step;

/// A step in a few words: `pause B 3ms after read_record#2 for 640ms`.
pub fn step_words(step: &Step) -> String {
    let when = match &step.after {
        None => format!("at +{}ms", step.at_ms),
        Some(anchor) => format!(
            "{}ms after {}'s {}#{}",
            step.at_ms, anchor.worker, anchor.event, anchor.nth
        ),
    };
    let failover = step.target == crate::nemesis::generate::REDIS_PRIMARY;
    let lasting = (step.duration_ms).map_or(String::new(), |ms| match failover {
        true => format!(", lag {ms}ms"),
        false => format!(" for {ms}ms"),
    });
    let fault = match step.fault {
        Fault::Restart if failover => "failover",
        Fault::Restart => "restart",
        Fault::DropReply => "lost-reply",
        Fault::ClockStep => "clock-jump",
        other => other.as_str(),
    };
    format!("{fault} {} {when}{lasting}", step.target)
}

//! A queue drawn as lanes (lab 10): on each waiter's lane, the spans it waited and whom it
//! waited on, cut where a watch woke it.
//!
//! Whom a waiter waits on comes from the waiters' own reports: on joining, the waiter whose
//! key has the highest create revision below its own among those still in line (every
//! `queued` event carries its key's revision); after each `woke`, the owner of the key it
//! found ahead; one with nobody ahead does not wait. A waiter without a revision (the herd,
//! the spin, an election's candidate) waits on the lock itself.

use crate::events::{Event, Kind, What};

/// One span of waiting: from `from` to `to`, on `on` (a waiter's name), or on the lock.
#[derive(Debug, Clone, PartialEq)]
pub struct Wait {
    pub from: u64,
    pub to: u64,
    pub on: Option<String>,
    /// The waiter was still waiting when the part ended.
    pub open: bool,
}

/// The waits of `worker`, from the part's events (in the order the lab showed them).
pub fn of(events: &[(usize, &Event)], worker: &str) -> Vec<Wait> {
    let end = events.iter().map(|(_, e)| e.t_ms).max().unwrap_or(0);
    let mut waits = Vec::new();
    let mut current: Option<(u64, Option<String>)> = None;
    for (i, (_, event)) in events.iter().enumerate() {
        let mine = event.worker == worker || killed(event, worker);
        if !mine {
            continue;
        }
        let t = event.t_ms;
        let close = |current: &mut Option<(u64, Option<String>)>, waits: &mut Vec<Wait>| {
            if let Some((from, on)) = current.take() {
                waits.push(Wait {
                    from,
                    to: t,
                    on,
                    open: false,
                });
            }
        };
        match &event.what {
            What::Queued(q) => {
                close(&mut current, &mut waits);
                current = match q.revision {
                    // The recipe: it waits on the one ahead, if anyone is.
                    Some(revision) => {
                        ahead_at(&events[..i], worker, revision).map(|ahead| (t, Some(ahead)))
                    }
                    None => Some((t, None)),
                };
            }
            What::Woke(woke) => {
                close(&mut current, &mut waits);
                let ahead = woke.ahead.as_deref().and_then(|key| owner(events, key));
                if woke.ahead.is_some() {
                    current = Some((t, ahead));
                }
            }
            _ if matches!(
                event.kind(),
                Kind::Acquired | Kind::GaveUp | Kind::Lost | Kind::Killed | Kind::Released
            ) =>
            {
                close(&mut current, &mut waits)
            }
            _ => {}
        }
    }
    if let Some((from, on)) = current {
        waits.push(Wait {
            from,
            to: end,
            on,
            open: true,
        });
    }
    waits
}

fn killed(event: &Event, worker: &str) -> bool {
    matches!(&event.what, What::Killed(f) if f.target.as_deref() == Some(worker))
}

/// The waiter whose `queued` event names `key`.
fn owner(events: &[(usize, &Event)], key: &str) -> Option<String> {
    events.iter().find_map(|(_, e)| match &e.what {
        What::Queued(q) if q.key.as_deref() == Some(key) => Some(e.worker.clone()),
        _ => None,
    })
}

/// Among the waiters that joined before (`before`) and had not left, the one with the
/// highest revision below `revision`.
fn ahead_at(before: &[(usize, &Event)], worker: &str, revision: i64) -> Option<String> {
    let left = |name: &str| {
        before.iter().any(|(_, e)| {
            killed(e, name)
                || (e.worker == name
                    && matches!(e.kind(), Kind::GaveUp | Kind::Lost | Kind::Released))
        })
    };
    before
        .iter()
        .filter_map(|(_, e)| match &e.what {
            What::Queued(q) if e.worker != worker => q.revision.map(|r| (r, e.worker.clone())),
            _ => None,
        })
        .filter(|(r, name)| *r < revision && !left(name))
        .max_by_key(|(r, _)| *r)
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::facts::{Acquired, GaveUp, Queued, Woke};

    fn at(t_ms: u64, mut event: Event) -> Event {
        event.t_ms = t_ms;
        event
    }

    fn queued(t: u64, who: &str, revision: i64) -> Event {
        at(
            t,
            Event::new(
                who,
                Queued {
                    key: Some(format!("q/{who}")),
                    revision: Some(revision),
                    ..Queued::default()
                },
                "joins",
            ),
        )
    }

    #[test]
    fn a_waiter_waits_on_the_one_ahead_then_on_whom_it_finds_when_woken() {
        let events = [
            queued(0, "H", 10),
            at(1, Event::new("H", Acquired::default(), "holds")),
            queued(2, "W1", 11),
            queued(3, "W2", 12),
            queued(4, "W3", 13),
            at(5, Event::new("W2", GaveUp::default(), "gives up")),
            at(
                6,
                Event::new(
                    "W3",
                    Woke {
                        gone: Some("q/W2".into()),
                        ahead: Some("q/W1".into()),
                    },
                    "woken",
                ),
            ),
            at(
                9,
                Event::new(
                    "W3",
                    Woke {
                        gone: Some("q/W1".into()),
                        ahead: None,
                    },
                    "woken",
                ),
            ),
            at(9, Event::new("W3", Acquired::default(), "holds")),
        ];
        let indexed: Vec<(usize, &Event)> = events.iter().enumerate().collect();
        let waits = of(&indexed, "W3");
        let on: Vec<(u64, u64, Option<&str>)> = waits
            .iter()
            .map(|w| (w.from, w.to, w.on.as_deref()))
            .collect();
        assert_eq!(on, [(4, 6, Some("W2")), (6, 9, Some("W1"))]);
        // H found nobody ahead: it never waited.
        assert!(of(&indexed, "H").is_empty());
        // W1 still waits on H at the end of these events.
        let w1 = of(&indexed, "W1");
        assert_eq!(w1.len(), 1);
        assert!(w1[0].open);
        assert_eq!(w1[0].on.as_deref(), Some("H"));
    }
}

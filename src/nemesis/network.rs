//! Network faults: the nemesis aimed at one path of the fault proxy ([`crate::proxy`]).
//!
//! A path is one worker's link to one server (`A→store`), so a fault on it touches no
//! other worker and no process: the worker runs throughout, and only its bytes are late,
//! lost or refused. Like every fault, the start is recorded before the proxy acts, and the
//! end (`heal`) before the path carries bytes again, so nothing the fault causes or
//! releases can stand above it on the timeline.
//!
//! A path left faulty when a lab ends early heals by going away: dropping a [`Proxy`]
//! stops it, closes its connections and discards what it held.

use std::time::{Duration, Instant};

use super::{Fault, Nemesis, Note, Record};
use crate::events::{Event, What};
use crate::proxy::{Direction, NetFault, Proxy};

/// The history's name for a proxy fault.
pub fn fault_of(net: NetFault) -> Fault {
    match net {
        NetFault::Delay { .. }
        | NetFault::DelayNext { .. }
        | NetFault::DelayWrite { .. }
        | NetFault::DelayCommit { .. } => Fault::Delay,
        NetFault::Hold | NetFault::HoldWrite | NetFault::HoldFirstTouch | NetFault::HoldCommit => {
            Fault::Hold
        }
        NetFault::Reset | NetFault::BlackHole => Fault::Cut,
        NetFault::DropReply => Fault::DropReply,
    }
}

impl Nemesis {
    /// Puts `fault` on one direction of the proxy's path (replacing the one there).
    pub fn net(
        &mut self,
        history: &mut impl Record,
        proxy: &Proxy,
        direction: Direction,
        fault: NetFault,
        note: impl Into<Note>,
    ) {
        self.net_as(history, proxy, direction, (fault, fault_of(fault)), note);
    }

    /// [`Nemesis::net`], recorded under another name than the proxy's fault's own: a
    /// partition (`cut`) played as a hold, whose bytes go out once it heals, as TCP
    /// resends them after a partition.
    pub fn net_as(
        &mut self,
        history: &mut impl Record,
        proxy: &Proxy,
        direction: Direction,
        (fault, recorded): (NetFault, Fault),
        note: impl Into<Note>,
    ) {
        self.net_caught(history, proxy, direction, recorded, note);
        proxy.set(direction, fault);
    }

    /// Records a fault on the path that the proxy put on by itself: a write it was told to
    /// catch ([`NetFault::DelayWrite`], [`NetFault::HoldWrite`]), caught and held now. It
    /// ends with [`Nemesis::heal_net`], as any other.
    pub fn net_caught(
        &mut self,
        history: &mut impl Record,
        proxy: &Proxy,
        direction: Direction,
        recorded: Fault,
        note: impl Into<Note>,
    ) {
        let path = proxy.path().to_string();
        history.record(net_event(recorded, &path, direction, note));
        self.net.entry(path).or_insert_with(Instant::now);
    }

    /// Lifts the fault on one direction of the path and records its end with how long it
    /// lasted (`lasted_ms`), which it returns. Held bytes go out, in order, once recorded.
    pub fn heal_net(
        &mut self,
        history: &mut impl Record,
        proxy: &Proxy,
        direction: Direction,
        note: impl Into<Note>,
    ) -> Duration {
        let path = proxy.path().to_string();
        let lasted = self
            .net
            .remove(&path)
            .map_or(Duration::ZERO, |since| since.elapsed());
        let mut note = note.into();
        note.facts.lasted_ms = Some(lasted.as_millis() as u64);
        history.record(net_event(Fault::Heal, &path, direction, note));
        proxy.clear(direction);
        lasted
    }

    /// The proxy paths with a fault on, by name.
    pub fn faulty_paths(&self) -> Vec<String> {
        let mut paths: Vec<String> = self.net.keys().cloned().collect();
        paths.sort();
        paths
    }
}

/// A proxy fault's record: [`super::fault_event`]'s, aimed at a path (no process) and one
/// direction of it.
fn net_event(fault: Fault, path: &str, direction: Direction, note: impl Into<Note>) -> Event {
    let mut event = super::fault_event(fault, path, 0, note);
    if let What::NetFault(facts) | What::NetHealed(facts) = &mut event.what {
        facts.pid = None;
        facts.direction = Some(direction);
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Kind;
    use crate::events::facts::Phase;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[derive(Default)]
    struct Log(Vec<Event>);

    impl Record for Log {
        fn record(&mut self, event: Event) {
            self.0.push(event);
        }
    }

    #[test]
    fn a_hold_is_recorded_at_its_start_and_its_end_and_the_held_bytes_follow_the_end() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = server.local_addr().unwrap();
        let proxy = Proxy::start("A→echo", upstream).unwrap();
        let mut client = TcpStream::connect(proxy.addr()).unwrap();
        let (mut accepted, _) = server.accept().unwrap();
        accepted
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();

        let mut log = Log::default();
        let mut nemesis = Nemesis::new();
        nemesis.net(
            &mut log,
            &proxy,
            Direction::Up,
            NetFault::Hold,
            "holds A's bytes",
        );
        assert_eq!(nemesis.faulty_paths(), vec!["A→echo".to_string()]);
        client.write_all(b"write").unwrap();
        let mut buffer = [0u8; 16];
        assert!(accepted.read(&mut buffer).is_err(), "held: nothing arrives");

        let lasted = nemesis.heal_net(&mut log, &proxy, Direction::Up, "lets them go");
        accepted
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let n = accepted.read(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"write");
        assert!(nemesis.faulty_paths().is_empty());

        let kinds: Vec<Kind> = log.0.iter().map(|e| e.kind()).collect();
        assert_eq!(kinds, vec![Kind::NetFault, Kind::NetHealed]);
        let (What::NetFault(start), What::NetHealed(end)) = (&log.0[0].what, &log.0[1].what) else {
            unreachable!()
        };
        assert_eq!(start.fault, Some(Fault::Hold));
        assert_eq!(start.target.as_deref(), Some("A→echo"));
        assert_eq!(start.direction, Some(Direction::Up));
        assert_eq!(end.fault, Some(Fault::Heal));
        assert_eq!(end.phase, Some(Phase::End));
        assert_eq!(end.lasted_ms, Some(lasted.as_millis() as u64));
    }

    #[test]
    fn every_proxy_fault_has_a_name_in_the_history() {
        let names: Vec<&str> = [
            NetFault::Delay {
                ms: 5,
                jitter_ms: 0,
            },
            NetFault::DelayNext { ms: 5 },
            NetFault::Hold,
            NetFault::Reset,
            NetFault::BlackHole,
            NetFault::DropReply,
        ]
        .into_iter()
        .map(|net| fault_of(net).as_str())
        .collect();
        assert_eq!(
            names,
            vec!["delay", "delay", "hold", "cut", "cut", "drop_reply"]
        );
    }
}

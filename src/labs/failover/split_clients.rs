//! Lab 5's split brain: its two clients. A and B are lockslab's own connections, each made
//! from inside its host ([`Hosts::connect_from`]), so that a partition cuts them as it
//! would cut any client there. A finds the primary through a Sentinel before the cut, then
//! renews its lock and writes; B, after the cut, asks a Sentinel on its side until it
//! names another primary.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use redis::Value;

use super::split_check::{OLD_PRIMARY, WRITES_RESOURCE};
use crate::events::Event;
use crate::events::facts::{Lost, Wrote};
use crate::hosts::{Hosts, SENTINEL_PORT};
use crate::labs::Stage;
use crate::store::Outcome;

/// The name the Sentinels know the primary by.
pub(super) const MASTER_NAME: &str = "lockslab";
/// The lock's lease, and how often A renews it (a third of it, as lockslab's heartbeat does).
pub const LOCK_TTL: Duration = Duration::from_secs(3);
pub(super) const RENEW_EVERY: Duration = Duration::from_millis(1000);
/// How often A writes to the primary.
pub(super) const WRITE_EVERY: Duration = Duration::from_millis(200);
/// How long a client waits for an answer from a server on its side.
const PATIENCE: Duration = Duration::from_millis(800);

/// The round's keys: the lock, and the list A's numbered writes go to.
pub(super) struct Keys {
    pub(super) lock: String,
    pub(super) writes: String,
}

/// One client's connection to a server, made from inside its host: what the partition
/// cuts. It speaks RESP itself (the redis crate builds its connections from addresses
/// only, and this socket was made in another network).
pub(super) struct Line {
    stream: TcpStream,
    parser: redis::Parser,
}

impl Line {
    fn open(hosts: &Hosts, from: &str, to: SocketAddr, password: &str) -> Result<Line> {
        let stream = hosts.connect_from(from, to, PATIENCE)?;
        stream.set_read_timeout(Some(PATIENCE))?;
        stream.set_write_timeout(Some(PATIENCE))?;
        let mut line = Line {
            stream,
            parser: redis::Parser::new(),
        };
        line.call(redis::cmd("AUTH").arg(password))
            .with_context(|| format!("AUTH at {to} from {from}"))?;
        Ok(line)
    }

    /// Sends one command and reads its answer; a server's error reply is an `Err`.
    fn call(&mut self, command: &redis::Cmd) -> redis::RedisResult<Value> {
        self.stream.write_all(&command.get_packed_command())?;
        self.parser.parse_value(&mut self.stream)?.extract_error()
    }
}

/// A: finds the primary through a Sentinel before the cut, takes the lock there, and from
/// then on renews it and writes, every write numbered and answered by the old primary.
pub(super) struct ClientA {
    line: Option<Line>,
    keys: Keys,
    pub(super) owner: String,
    /// The primary a Sentinel named, where A took the lock.
    pub(super) primary: SocketAddr,
    /// Drawn from the store's sequence once A holds the lock.
    pub(super) token: i64,
    written: u64,
    next_write: Instant,
    next_renew: Instant,
    /// The first refusal of a write is shown on the timeline; the rest only recorded.
    refusal_shown: bool,
    /// A renewal was refused: A renews no more.
    lost: bool,
}

impl ClientA {
    /// Asks a Sentinel (from client-a, before the cut) for the primary and takes the lock
    /// there; the caller draws its token.
    pub(super) fn take_lock(hosts: &Hosts, password: &str, keys: Keys) -> Result<ClientA> {
        let sentinel = SocketAddr::new(hosts.addr("sentinel-1")?.into(), SENTINEL_PORT);
        let mut asked = Line::open(hosts, "client-a", sentinel, password)?;
        let primary = primary_named(&mut asked)?;
        let mut line = Line::open(hosts, "client-a", primary, password)?;
        let owner = format!("A-{}", crate::seed::os_hex(8));
        let set = line.call(
            redis::cmd("SET")
                .arg(&keys.lock)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(LOCK_TTL.as_millis() as u64),
        )?;
        if set == Value::Nil {
            bail!("A could not take the free lock on the primary");
        }
        Ok(ClientA {
            line: Some(line),
            keys,
            owner,
            primary,
            token: 0,
            written: 0,
            next_write: Instant::now(),
            next_renew: Instant::now() + RENEW_EVERY,
            refusal_shown: false,
            lost: false,
        })
    }

    /// Renews and writes when due; a connection the server closed ends A's work.
    pub(super) fn work(&mut self, stage: &mut Stage) {
        let now = Instant::now();
        if now >= self.next_renew {
            self.next_renew = now + RENEW_EVERY;
            self.renew(stage);
        }
        if now >= self.next_write {
            self.next_write = now + WRITE_EVERY;
            self.write(stage);
        }
    }

    /// Re-arms A's key if it is still A's. Once a renewal is refused A knows its lease may
    /// end and stops renewing (it goes on writing: its work is what the lab watches).
    fn renew(&mut self, stage: &mut Stage) {
        let Some(line) = self.line.as_mut().filter(|_| !self.lost) else {
            return;
        };
        let answer = line.call(
            redis::cmd("EVAL")
                .arg(crate::lock::redis::EXTEND_IF_OWNER)
                .arg(1)
                .arg(&self.keys.lock)
                .arg(&self.owner)
                .arg(LOCK_TTL.as_millis() as u64),
        );
        let why = match answer {
            Ok(Value::Int(1)) => return,
            Ok(_) => "the key is no longer A's".to_string(),
            Err(err) => refusal(&err),
        };
        self.lost = true;
        stage.record(Event::new(
            "A",
            Lost::because(why.clone()),
            format!("A's renewal refused by the old primary ({why}): A stops renewing"),
        ));
    }

    /// One numbered write (`RPUSH` of its number), recorded with the server's answer: a
    /// length is an acknowledgement.
    fn write(&mut self, stage: &mut Stage) {
        let Some(line) = self.line.as_mut() else {
            return;
        };
        self.written += 1;
        let number = self.written;
        let answer = line.call(redis::cmd("RPUSH").arg(&self.keys.writes).arg(number));
        let (outcome, words) = match &answer {
            Ok(Value::Int(length)) => {
                (Outcome::Accepted, format!("acknowledged (length {length})"))
            }
            Ok(other) => (Outcome::Unknown, format!("answered {other:?}")),
            Err(err) if err.is_io_error() => (
                Outcome::Unknown,
                format!("no answer, the old primary closed A's connection ({err})"),
            ),
            Err(err) => (Outcome::Rejected, format!("refused: {}", refusal(err))),
        };
        let event = Event::new(
            "A",
            Wrote {
                value: Some(number.to_string()),
                resource: Some(WRITES_RESOURCE.into()),
                ..Wrote::new(outcome)
            },
            format!("A's write #{number} to the old primary: {words}"),
        );
        if outcome == Outcome::Unknown {
            // The server closed the connection (Sentinel does, when it demotes it).
            self.line = None;
            stage.record(event);
        } else if outcome == Outcome::Rejected && !self.refusal_shown {
            self.refusal_shown = true;
            stage.record(event);
        } else {
            stage.record_off_terminal(event);
        }
    }
}

/// B: asks a Sentinel on its side for the primary until it names another one, checks that
/// server says it is the primary (`ROLE`), and takes the lock there.
#[derive(Default)]
pub(super) struct ClientB {
    sentinel: Option<Line>,
    next_try: Option<Instant>,
}

impl ClientB {
    /// One try; Some(grant) once the lock is B's.
    pub(super) fn try_lock(
        &mut self,
        hosts: &Hosts,
        password: &str,
        lock: &str,
    ) -> Result<Option<(SocketAddr, String)>> {
        if self.next_try.is_some_and(|at| Instant::now() < at) {
            return Ok(None);
        }
        self.next_try = Some(Instant::now() + Duration::from_millis(250));
        if self.sentinel.is_none() {
            let at = SocketAddr::new(hosts.addr("sentinel-2")?.into(), SENTINEL_PORT);
            self.sentinel = Line::open(hosts, "client-b", at, password).ok();
        }
        let Some(sentinel) = self.sentinel.as_mut() else {
            return Ok(None);
        };
        let Ok(primary) = primary_named(sentinel) else {
            self.sentinel = None;
            return Ok(None);
        };
        if primary.ip() == std::net::IpAddr::from(hosts.addr(OLD_PRIMARY)?) {
            return Ok(None); // Not failed over yet (and that address is across the cut).
        }
        let Ok(mut line) = Line::open(hosts, "client-b", primary, password) else {
            return Ok(None);
        };
        let role = line.call(&redis::cmd("ROLE"));
        let is_master = matches!(&role, Ok(Value::Array(items))
            if matches!(items.first(), Some(Value::BulkString(word)) if word == b"master"));
        if !is_master {
            return Ok(None);
        }
        let owner = format!("B-{}", crate::seed::os_hex(8));
        let set = line.call(
            redis::cmd("SET")
                .arg(lock)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(LOCK_TTL.as_millis() as u64),
        );
        match set {
            Ok(Value::Okay) | Ok(Value::SimpleString(_)) => {}
            _ => return Ok(None),
        }
        Ok(Some((primary, owner)))
    }
}

/// A server's refusal in a few words: its code and the first sentence of its message
/// (`NOREPLICAS Not enough good replicas to write`), without the script's digest.
fn refusal(err: &redis::RedisError) -> String {
    let detail = err.detail().unwrap_or_default();
    let first = detail.split(['.', '\n']).next().unwrap_or_default().trim();
    match err.code() {
        Some(code) => format!("{code} {first}"),
        None => format!("{err}"),
    }
}

/// The primary a Sentinel names, asked on a client's own line.
pub(super) fn primary_named(sentinel: &mut Line) -> Result<SocketAddr> {
    let answer = sentinel.call(
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME),
    )?;
    let (ip, port): (String, u16) = redis::from_redis_value(answer)?;
    Ok(SocketAddr::new(ip.parse()?, port))
}

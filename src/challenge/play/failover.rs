//! The failover challenge's fault, played on the Redis the clients take their locks and
//! tokens from (lab 5's Sentinel cluster): once a few jobs are answered the replica is
//! frozen and its link cut, so the writes of the next jobs live on the primary only; a few
//! jobs later the primary is killed and the replica thawed, and Sentinel promotes it. What
//! the promoted replica lacks is read from both servers' own answers: the run's keys on
//! the primary just before it died, and on the replica once it is the primary (a key
//! with a TTL may lack there because it expired meanwhile: the line says lacks, not lost).

use super::*;
use crate::cluster::{self, MASTER_NAME, SentinelCluster};
use crate::events::facts::{FaultFacts, HolderNow};
use crate::nemesis::schedule::How;
use crate::nemesis::{Note, Victim};

/// The replica's and the primary's names in the history (and in the schedule's steps).
pub(super) const REPLICA: &str = "replica";
const PRIMARY: &str = "primary";

/// How long Sentinel may take to promote the replica.
const PROMOTION_TIMEOUT: Duration = Duration::from_secs(20);

/// The failover's progress through a run.
enum Step {
    /// Until `cut_after` jobs are answered.
    Waiting,
    /// The replica frozen and cut off when this many jobs were answered.
    Cut { answered: usize },
    /// The primary killed: Sentinel's turn.
    Killed { at: Instant },
    /// The replica promoted (or the run gave up waiting).
    Done,
}

pub(super) struct Failover<'a> {
    cluster: &'a mut SentinelCluster,
    cut_after: usize,
    kill_after: usize,
    step: Step,
    /// The clients' keys and their values on the primary just before it died.
    on_primary: Vec<(String, Option<String>)>,
    /// When Sentinel was last asked.
    asked: Option<Instant>,
}

impl<'a> Failover<'a> {
    pub(super) fn new(cluster: &'a mut SentinelCluster, after: (usize, usize)) -> Failover<'a> {
        Failover {
            cluster,
            cut_after: after.0,
            kill_after: after.1,
            step: Step::Waiting,
            on_primary: Vec::new(),
            asked: None,
        }
    }

    /// The cluster as the run starts, for the history: its ports.
    pub(super) fn started(&self) -> Event {
        let cluster = &self.cluster;
        let sentinels: Vec<String> = cluster
            .sentinels
            .iter()
            .map(|s| format!(":{}", s.port))
            .collect();
        let text = format!(
            "primary :{}, replica :{}, Sentinels {}",
            cluster.primary.port,
            cluster.replica.port,
            sentinels.join(" ")
        );
        Event::new("redis", HolderNow::default(), text)
    }

    /// The primary's URL, where the replica's link is cut.
    pub(super) fn primary_url(&self) -> String {
        self.cluster.primary.url()
    }

    /// The primary and the replica, for the nemesis to aim at.
    pub(super) fn victims(&mut self) -> [&mut dyn Victim; 2] {
        let cluster = &mut *self.cluster;
        [&mut cluster.primary, &mut cluster.replica]
    }

    /// Under way: the run waits for its end.
    pub(super) fn under_way(&self) -> bool {
        matches!(self.step, Step::Killed { .. })
    }

    /// Why it did not play, for the verdict.
    pub(super) fn unplayed(&self, answered: usize) -> Option<String> {
        let wanted = match self.step {
            Step::Waiting => self.cut_after,
            Step::Cut { answered: at } => at + self.kill_after,
            Step::Killed { .. } => {
                return Some(
                    "the primary was killed, and the run ended before Sentinel promoted the \
                     replica: the failover never finished"
                        .to_string(),
                );
            }
            Step::Done => return None,
        };
        Some(format!(
            "the failover waited for {wanted} jobs answered ok, and the run ended at \
             {answered}"
        ))
    }
}

/// Every key of the run on a Redis server, with its value (none for a key that is not a
/// string): what a client wrote there.
fn keys_of(url: &str, prefix: &str) -> Result<Vec<(String, Option<String>)>> {
    let mut connection = cluster::ask(url)?;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query(&mut connection)?;
    keys.sort();
    let mut values = Vec::new();
    for key in keys {
        let value: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query(&mut connection)
            .unwrap_or(None);
        values.push((key, value));
    }
    Ok(values)
}

impl Run<'_> {
    /// Plays the failover's next step when it falls due.
    pub(super) fn play_failover(&mut self) -> Result<()> {
        let answered = self.acknowledged.len();
        let Some(failover) = self.failover.as_mut() else {
            return Ok(());
        };
        if self.faults.is_none() {
            return Ok(());
        }
        let (primary, replica) = (failover.cluster.primary.port, failover.cluster.replica.port);
        match failover.step {
            Step::Waiting if answered >= failover.cut_after => {
                failover.step = Step::Cut { answered };
                // A pause that cuts the replica's link: the nemesis's lag.
                let lag = How {
                    cut_link: true,
                    ..How::default()
                };
                self.play_now((Fault::Pause, REPLICA, lag), move |cue| {
                    let closed = cue.links_closed.map_or("none".into(), |n| n.to_string());
                    let facts = FaultFacts {
                        port: Some(replica),
                        ..FaultFacts::default()
                    };
                    let text = format!(
                        "freezes Redis replica :{replica}, cuts its link ({closed} closed)"
                    );
                    Note::new(text, facts)
                })?;
            }
            Step::Cut { answered: at } if answered >= at + failover.kill_after => {
                let prefix = &self.setup.init.key_prefix;
                failover.on_primary = keys_of(&failover.cluster.primary.url(), prefix)?;
                let facts = FaultFacts {
                    port: Some(primary),
                    ..FaultFacts::default()
                };
                let text = format!(
                    "kills Redis primary :{primary}, {} jobs answered after the cut",
                    answered - at
                );
                let kill = Note::new(text, facts.clone());
                let text = format!("thaws replica :{replica}: Sentinel's turn");
                let thaw = Note::new(
                    text,
                    FaultFacts {
                        port: Some(replica),
                        ..facts
                    },
                );
                let plain = How::default();
                self.play_now((Fault::Kill, PRIMARY, plain.clone()), move |_| kill)?;
                self.play_now((Fault::Resume, REPLICA, plain), move |_| thaw)?;
                if let Some(failover) = self.failover.as_mut() {
                    failover.step = Step::Killed { at: Instant::now() };
                }
            }
            Step::Killed { at } => {
                if failover
                    .asked
                    .is_some_and(|asked| asked.elapsed() < Duration::from_millis(50))
                {
                    return Ok(());
                }
                failover.asked = Some(Instant::now());
                let named = failover.cluster.sentinels.iter().any(|sentinel| {
                    cluster::master_addr_from(&sentinel.url(), MASTER_NAME).as_deref()
                        == Some(failover.cluster.replica.addr().as_str())
                });
                let url = failover.cluster.replica.url();
                if !named || cluster::role_of(&url).as_deref() != Some("master") {
                    if at.elapsed() > PROMOTION_TIMEOUT {
                        bail!(
                            "Sentinel did not promote the replica within {}s of the \
                             primary's death (a busy machine? run again)",
                            PROMOTION_TIMEOUT.as_secs()
                        );
                    }
                    return Ok(());
                }
                let took = at.elapsed().as_millis() as u64;
                let on_replica = keys_of(&url, &self.setup.init.key_prefix)?;
                let lacks: Vec<String> = failover
                    .on_primary
                    .iter()
                    .filter(|pair| !on_replica.contains(pair))
                    .map(|(key, value)| {
                        let now = on_replica.iter().find(|(k, _)| k == key);
                        let now = now.map_or("none", |(_, v)| v.as_deref().unwrap_or("?"));
                        let short = key.strip_prefix(self.setup.init.key_prefix.as_str());
                        let was = value.as_deref().unwrap_or("?");
                        format!("{} {was} → {now}", short.unwrap_or(key))
                    })
                    .collect();
                let facts = HolderNow {
                    failover_ms: Some(took),
                    ..Default::default()
                };
                let text = format!("Sentinel promoted :{replica}, {took}ms after the kill");
                self.tape.record(Event::new("redis", facts, text));
                let text = match failover.on_primary.len() {
                    0 => format!(":{primary} held no key of the run as it died"),
                    held => format!(
                        ":{replica} lacks {} of {held} keys :{primary} had",
                        lacks.len()
                    ),
                };
                self.tape
                    .record(Event::new("redis", HolderNow::default(), text));
                // The shortest, for the lines' width: a counter's, where there is one.
                let mut shown = lacks.clone();
                shown.sort_by_key(String::len);
                let short: Vec<&String> = shown.iter().filter(|l| l.len() <= 48).take(2).collect();
                let mut lines: Vec<String> = short.iter().map(|lack| format!("  {lack}")).collect();
                if lacks.len() > short.len() {
                    let more = lacks.len() - short.len();
                    let which = if short.is_empty() { "" } else { " more" };
                    lines.push(format!("  and {more}{which}, not shown (the longest)"));
                }
                for text in lines {
                    self.tape
                        .record(Event::new("redis", HolderNow::default(), text));
                }
                self.faults_played += 1;
                failover.step = Step::Done;
            }
            _ => {}
        }
        Ok(())
    }
}

//! Lab 6 — Redlock: five Redis masters, a quorum, a validity window, and the debate about it.
//!
//! The lab starts N private Redis masters (five by default: independent processes, no
//! replication, no persistence) and plays four scenarios, each with its own verdict:
//!
//! ```text
//!  minority      two masters down (SIGKILL), then frozen (SIGSTOP): still granted;
//!                three down: not granted, the release sent to every master (a frozen one
//!                may still set the key once thawed)
//!  restart       A holds m1–m3; m3 crashes and restarts empty; B gets m3–m5: two holders.
//!                With m3 kept down longer than the TTL, B is refused
//!  clock-jump    A holds m1–m4; the clocks of m3 and m4 jump (SIMULATED: PEXPIRE);
//!                B gets m3–m5: two holders
//!  client-pause  A freezes past its validity; B takes the lock; A wakes and writes:
//!                unfenced it lands; by its random value compare-and-set at the resource
//!                it is refused if A claimed before its pause, taken if A's claim came
//!                after it; fenced by a Postgres sequence it is refused
//! ```
//!
//! What is real: the masters are real redis-server processes, really killed, frozen and
//! restarted on their ports; the clients' SETs and releases are real, and every verdict is
//! read back from the masters' own answers (their replies, then GET and PTTL on each) and
//! from the fenced store. What is simulated: the clock jump — Debian's redis-server crashes
//! under libfaketime, so the lab does to the key what a forward jump of the master's clock
//! would do to its expiry, shortening its PTTL with PEXPIRE, and says so where it does it.
//!
//! Clients A and B of the first three scenarios are played by the lab itself (nothing
//! freezes them: the faults there are the servers'); the client that pauses is a worker
//! process, since only a separate process can be frozen the way a pause freezes a client.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use colored::Colorize;
use nix::sys::signal::Signal;
use serde::Serialize;
use serde_json::json;

use super::leftovers::Leftovers;
use super::{OutputArgs, Stage, duration_in, new_run_id};
use crate::check;
use crate::connect::{self, Backend};
use crate::events::{Event, Kind};
use crate::lock::redlock::{self, Attempt, Master, Redlock, Reply, Settings};
use crate::output::{Style, human, json_line, table};
use crate::procs;
use crate::servers::{self, LabUrlParser, Lifetime, PrivateServers, ServerArgs};
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::redlock_client::{RedlockClientScript, Resources, indent, round_text};

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab redlock                       all four scenarios on five private masters
  lockslab redlock restart               one scenario: a master restarting empty
  lockslab redlock --masters 3           three masters (quorum 2)
  lockslab redlock --instance-timeout 200ms   frozen masters eat more of the validity
  lockslab redlock --json | jq .         events and verdict as JSON Lines
  lockslab redlock --master redis://a:6379 --master redis://b:6379 \\
                   --master redis://c:6379   three masters of yours

By default the masters are private to the run: the lab kills, freezes and
restarts them, which it must never do to a server someone else uses (a given
--redis-url is not used here). With --master it uses yours and plays only
clock-jump and client-pause (minority and restart kill and restart masters);
the run's keys lockslab:<run id>:* are removed from yours at the end.
The clock jump is SIMULATED with PEXPIRE (redis-server cannot run under libfaketime).
By hand, with redis-cli against five ports: see labs/06-redlock.md.", crate::lab_exit_status_help!()))]
pub struct RedlockArgs {
    /// Play one scenario only [default: all four, in this order]
    #[arg(value_enum)]
    pub scenario: Option<Scenario>,
    /// How many Redis masters to start: odd, 3 to 9
    #[arg(long, default_value_t = 5, value_parser = parse_masters, value_name = "N",
          conflicts_with = "master")]
    pub masters: usize,
    /// An existing Redis master to use instead of private ones; repeat it (3 to 9, odd)
    #[arg(long = "master", value_name = "URL",
          value_parser = LabUrlParser(Backend::Redis, "--master"))]
    pub master: Vec<String>,
    /// The lock's TTL on every master (200ms to 1m)
    #[arg(long, default_value = "2s", value_name = "DURATION",
          value_parser = duration_in(Duration::from_millis(200), Duration::from_secs(60)))]
    pub ttl: Duration,
    /// The clock drift allowed, as a fraction of the TTL (0 to 0.5); 2ms are added to it.
    /// 0.01 and 2ms are the reference implementations' choice, not part of the algorithm
    #[arg(long, default_value_t = 0.01, value_parser = parse_drift_factor, value_name = "FRACTION")]
    pub drift_factor: f64,
    /// The longest random delay before a client tries again (0 to 10s)
    #[arg(long, default_value = "200ms", value_name = "DURATION",
          value_parser = duration_in(Duration::ZERO, Duration::from_secs(10)))]
    pub retry: Duration,
    /// How long one master may take to answer before it counts as no (5ms to 1s)
    #[arg(long, default_value = "50ms", value_name = "DURATION",
          value_parser = duration_in(Duration::from_millis(5), Duration::from_secs(1)))]
    pub instance_timeout: Duration,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

fn parse_masters(text: &str) -> Result<usize, String> {
    let n: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if !(3..=9).contains(&n) || n.is_multiple_of(2) {
        return Err(
            "use an odd number from 3 to 9 (an even one adds a master and no safety)".into(),
        );
    }
    Ok(n)
}

fn parse_drift_factor(text: &str) -> Result<f64, String> {
    let factor: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number (e.g. 0.01)"))?;
    if !(0.0..=0.5).contains(&factor) {
        return Err("use a fraction from 0 to 0.5 (0.01 is the algorithm's own)".into());
    }
    Ok(factor)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// A minority of masters down or frozen, then a majority down
    Minority,
    /// A master restarting empty; then kept down longer than the TTL
    Restart,
    /// Clocks jumping forward on some masters (simulated with PEXPIRE)
    ClockJump,
    /// The client pauses past its validity; its random value compare-and-set vs a token
    ClientPause,
}

impl Scenario {
    /// It kills, freezes or restarts masters: only masters the lab started itself will do.
    fn needs_own_masters(&self) -> bool {
        matches!(self, Scenario::Minority | Scenario::Restart)
    }

    /// Its name on the command line.
    fn command_name(&self) -> &'static str {
        match self {
            Scenario::Minority => "minority",
            Scenario::Restart => "restart",
            Scenario::ClockJump => "clock-jump",
            Scenario::ClientPause => "client-pause",
        }
    }
}

const ALL: [Scenario; 4] = [
    Scenario::Minority,
    Scenario::Restart,
    Scenario::ClockJump,
    Scenario::ClientPause,
];

/// A read-back of the masters gets this long per master: they are local, and one that
/// does not answer in time is reported as such.
const READ_TIMEOUT: Duration = Duration::from_millis(300);

/// What a stale write came to in one resource of the store.
#[derive(Serialize, Debug, Clone)]
pub struct StaleWrite {
    /// A's write was decided after B's accepted write.
    pub attempted: bool,
    /// Whether the store took it; null when there was none.
    pub accepted: Option<bool>,
    pub a_token: Option<i64>,
    pub b_token: Option<i64>,
}

/// What the paused client's late write came to in one resource of the store (client-pause).
#[derive(Serialize, Debug, Clone)]
pub struct GuardedWrite {
    /// `unfenced`, `claim` (antirez: the random value compare-and-set at the resource,
    /// claimed at the grant), `late_claim` (Kleppmann: the same, A's claim made after its
    /// pause) or `sequence` (a token from a Postgres sequence).
    pub guard: &'static str,
    pub resource: String,
    #[serde(flatten)]
    pub stale: StaleWrite,
    /// Whose result the resource holds at the end.
    pub final_writer: Option<String>,
}

/// One master's state for a key, as it answered GET and PTTL.
#[derive(Serialize, Debug, Clone)]
pub struct MasterState {
    pub master: String,
    pub port: String,
    /// Whose value the key holds (`A`, `B`; `other` for a value no client of this
    /// scenario wrote), null when there is no key.
    pub holder: Option<String>,
    /// -2: no key. Null when the master did not answer.
    pub pttl_ms: Option<i64>,
    pub answered: bool,
    /// Why there is no answer: down, frozen, or what the client library said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// One client's round, as it goes into the verdict.
#[derive(Serialize, Debug, Clone)]
pub struct ClientRound {
    pub client: String,
    #[serde(flatten)]
    pub attempt: Attempt,
}

/// One scenario's verdict: every field read from the masters' answers or the store.
#[derive(Serialize, Debug, Clone)]
pub struct ScenarioVerdict {
    pub name: &'static str,
    /// The deciding round (B's, or the only client's) was granted.
    pub granted: bool,
    pub quorum: usize,
    /// The deciding round's validity.
    pub validity_ms: i64,
    /// Two clients each held a majority's grant at the same moment (null where only one
    /// client played).
    pub two_holders: Option<bool>,
    /// The paused client's write to the unfenced resource (client-pause only).
    pub stale_write: Option<StaleWrite>,
    /// The paused client's write to each resource of the store, one row per guard
    /// (client-pause only): unfenced, claimed by value, claimed late, sequence token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guarded_writes: Option<Vec<GuardedWrite>>,
    /// Masters that still held the failed round's value after its release (majority-down).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_after_release: Option<Vec<String>>,
    /// Frozen masters that set the failed round's key once thawed (majority-down): the
    /// release did not reach it there, and only the TTL removes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_once_thawed: Option<Vec<String>>,
    pub rounds: Vec<ClientRound>,
    /// The masters read back at the scenario's decisive moment.
    pub read_back: Vec<MasterState>,
    /// Set when part of the scenario is simulated, saying which part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<&'static str>,
    pub meaning: String,
    pub prevented_by: &'static str,
}

/// `lockslab redlock`.
pub fn run(args: &RedlockArgs) -> Result<()> {
    let style = Style::detect(args.output.json);
    let given = !args.master.is_empty();
    let n = if given {
        args.master.len()
    } else {
        args.masters
    };
    if given && (!(3..=9).contains(&n) || n.is_multiple_of(2)) {
        crate::bail_usage!(
            "--master given {n} times: name an odd number of masters from 3 to 9 (an even one adds a master and no safety)"
        );
    }
    if args.instance_timeout * (n as u32) * 2 >= args.ttl {
        crate::bail_usage!(
            "--instance-timeout {} × {n} masters must stay well below --ttl {}: use a shorter timeout or a longer TTL",
            human(args.instance_timeout),
            human(args.ttl)
        );
    }
    let wanted: Vec<Scenario> = match args.scenario {
        Some(one) => vec![one],
        None => ALL.to_vec(),
    };
    let (skipped, scenarios): (Vec<Scenario>, Vec<Scenario>) = wanted
        .into_iter()
        .partition(|s| given && s.needs_own_masters());
    if scenarios.is_empty() {
        crate::bail_usage!(
            "{}: it needs masters lockslab starts itself (it kills, freezes and restarts them); run it without --master",
            skipped[0].command_name()
        );
    }
    let run_id = new_run_id();
    let needs_store = scenarios.contains(&Scenario::ClientPause);
    let store_servers = if needs_store {
        Some(servers::provide(&args.servers, &[Backend::Postgres])?)
    } else {
        None
    };

    let intro = crate::output::Timeline::new(style);
    intro.say(&crate::output::run_heading("redlock", &run_id));
    // From this (the main) thread, one after another: each server's parent-death signal
    // is tied to the thread that starts it, which must outlive it.
    let started = Instant::now();
    let mut private = Vec::new();
    if !given {
        for _ in 0..n {
            private.push(PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun)?);
        }
    }
    let urls: Vec<String> = if given {
        args.master.clone()
    } else {
        private
            .iter()
            .map(|m| m.url(Backend::Redis).unwrap_or_default())
            .collect()
    };
    let ports: Vec<String> = urls
        .iter()
        .map(|url| Master::new("", url).port().to_string())
        .collect();
    if given {
        for (i, url) in urls.iter().enumerate() {
            let mut master = Master::new(&Lab::name(i), url);
            master
                .command::<String>(&redis::cmd("PING"), Duration::from_secs(2))
                .map_err(|why| {
                    anyhow::anyhow!(
                        "Redis master {} at {} did not answer PING: {why}; check that --master URL",
                        Lab::name(i),
                        connect::redact(url)
                    )
                })?;
        }
        let shown: Vec<String> = urls.iter().map(|url| connect::redact(url)).collect();
        intro.say(&format!(
            "  {}",
            format!(
                "{n} Redis masters of yours (--master): {}\n  the run's keys lockslab:{run_id}:* are removed from them at the end",
                shown.join(" ")
            )
            .dimmed()
        ));
        for scenario in &skipped {
            intro.say(&format!(
                "  skipped: {} needs masters lockslab starts itself (it kills, freezes\n  and restarts them); run it without --master",
                scenario.command_name()
            ));
        }
    } else {
        intro.say(&format!(
            "  {}",
            format!(
                "{n} private Redis masters on ports {} (ready in {})\n  no replication, no persistence",
                ports.join(" "),
                human(started.elapsed())
            )
            .dimmed()
        ));
    }
    if let Some(servers) = &store_servers {
        for line in servers.describe() {
            intro.say(&format!("  {}", line.dimmed()));
        }
    }
    let q = redlock::quorum(n);
    let drift = redlock::drift(args.ttl, args.drift_factor);
    intro.say(&format!(
        "Redlock: held when {q} of {n} masters grant SET NX PX {} and validity > 0,\n\
         validity = TTL − elapsed − drift (drift = {} × TTL + 2ms = {}ms);\n\
         each master gets {} to answer. The default drift factor 0.01 and the 2ms\n\
         are the reference implementations' choice, not part of the algorithm.",
        args.ttl.as_millis(),
        args.drift_factor,
        drift.as_millis(),
        human(args.instance_timeout)
    ));

    let mut leftovers = Leftovers::of_run(&run_id);
    if given {
        for url in &urls {
            leftovers = leftovers.redis(url);
        }
    }
    let sequence = format!("lockslab_redlock_{run_id}");
    if let Some(servers) = &store_servers {
        let url = servers.url(Backend::Postgres);
        leftovers = leftovers
            .store(url)
            .sql(url, &format!("DROP SEQUENCE IF EXISTS {sequence}"));
    }
    let removal = leftovers.removed_at_the_end();
    let clock = Instant::now();
    let mut lab = Lab {
        settings: Settings {
            ttl: args.ttl,
            drift_factor: args.drift_factor,
            instance_timeout: args.instance_timeout,
            retry_delay_max: args.retry,
        },
        private,
        urls,
        stage: Stage::on_clock(style, clock),
        style,
        started: clock,
        run_id: run_id.clone(),
        values: Vec::new(),
        faults: vec![Fault::Up; n],
    };
    let masters_seen: Vec<serde_json::Value> = (0..lab.n())
        .map(|i| match lab.private.get(i) {
            Some(server) => json!({
                "master": Lab::name(i),
                "port": ports[i],
                "pid": server.pid(Backend::Redis),
                "dir": server.dir.display().to_string(),
            }),
            None => json!({
                "master": Lab::name(i),
                "port": ports[i],
                "url": connect::redact(&lab.urls[i]),
            }),
        })
        .collect();
    let skipped_seen: Vec<serde_json::Value> = skipped
        .iter()
        .map(|s| {
            json!({
                "name": s.command_name(),
                "why": "needs masters lockslab starts itself (it kills, freezes and restarts them)",
            })
        })
        .collect();
    lab.stage.record(
        Event::new(
            "lab",
            Kind::Run,
            format!("run {run_id}: the lock is the key lockslab:{run_id}:redlock:<scenario>"),
        )
        .with("run_id", run_id.as_str())
        .with("masters", masters_seen),
    );
    let result = (|| -> Result<Vec<ScenarioVerdict>> {
        let mut verdicts = Vec::new();
        for scenario in &scenarios {
            super::step::checkpoint(super::step::redlock::before(scenario.command_name()));
            match scenario {
                Scenario::Minority => verdicts.extend(lab.play_minority()?),
                Scenario::Restart => verdicts.extend(lab.play_restart()?),
                Scenario::ClockJump => verdicts.push(lab.play_clock_jump()?),
                Scenario::ClientPause => {
                    let url = store_servers
                        .as_ref()
                        .map(|s| s.url(Backend::Postgres).to_string())
                        .context("no store for the client-pause scenario")?;
                    verdicts.push(lab.play_client_pause(&url, &sequence)?);
                }
            }
        }
        Ok(verdicts)
    })()
    .map_err(connect::explain);
    removal.now(&result);
    let verdicts = result?;
    super::step::checkpoint(&super::step::redlock::VERDICT);

    if style.json {
        json_line(&json!({
            "kind": "verdict",
            "json_version": super::JSON_VERSION,
            "lab": "redlock",
            "run_id": run_id,
            "masters": n,
            "masters_given": given,
            "quorum": q,
            "ttl_ms": args.ttl.as_millis() as u64,
            "drift_factor": args.drift_factor,
            "drift_ms": drift.as_millis() as u64,
            "instance_timeout_ms": args.instance_timeout.as_millis() as u64,
            "retry_ms": args.retry.as_millis() as u64,
            "scenarios": verdicts,
            "skipped": skipped_seen,
        }));
    } else {
        print_verdicts(&verdicts, &skipped);
    }
    Ok(())
}

/// The lab's state across scenarios: the masters, one stage, one clock.
struct Lab {
    settings: Settings,
    /// One private server per master: each can be killed, frozen and restarted alone.
    /// Empty when the masters are the user's (`--master`): those the lab never touches.
    private: Vec<PrivateServers>,
    /// Every master's URL, private or given.
    urls: Vec<String>,
    stage: Stage,
    style: Style,
    /// The run's one clock: every scenario's events are stamped from here.
    started: Instant,
    run_id: String,
    /// Which client wrote which lock value: read-backs name the client, not the value.
    values: Vec<(String, String)>,
    /// What the lab has done to each master, so that a read-back does not wait on one it
    /// froze or killed itself.
    faults: Vec<Fault>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    Up,
    Down,
    Frozen,
}

impl Lab {
    fn n(&self) -> usize {
        self.urls.len()
    }

    fn q(&self) -> usize {
        redlock::quorum(self.n())
    }

    fn name(i: usize) -> String {
        format!("m{}", i + 1)
    }

    fn url(&self, i: usize) -> String {
        self.urls[i].clone()
    }

    /// Master `i`'s own process, when the lab started it.
    fn server(&mut self, i: usize) -> Result<&mut PrivateServers> {
        self.private
            .get_mut(i)
            .context("the lab kills, freezes and restarts only masters it started itself")
    }

    fn names(&self, indexes: impl IntoIterator<Item = usize>) -> String {
        indexes
            .into_iter()
            .map(Lab::name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn key(&self, scenario: &str) -> String {
        format!("lockslab:{}:redlock:{scenario}", self.run_id)
    }

    fn lock(&self, key: &str) -> Redlock {
        let masters = (0..self.n())
            .map(|i| Master::new(&Lab::name(i), &self.url(i)))
            .collect();
        Redlock::new(masters, key, self.settings.clone())
    }

    /// Starts a scenario: a stage of its own (its events only, so that waiting for "A
    /// acquired" never finds another scenario's A), on the run's one clock.
    fn heading(&mut self, scenario: &str, title: &str) {
        self.stage = Stage::on_clock(self.style, self.started);
        self.stage.tag("scenario", scenario);
        self.stage.timeline.say("");
        self.stage
            .timeline
            .say(&format!("{}", format!("── {title} ──").bold()));
    }

    fn note(&mut self, text: &str) {
        self.stage.record(Event::new("lab", Kind::Run, text));
    }

    /// One round of `client` on `lock`, shown master by master.
    fn acquire(&mut self, client: &str, lock: &mut Redlock) -> Attempt {
        let attempt = lock.try_acquire();
        self.values
            .push((attempt.value.clone(), client.to_string()));
        let (kind, conclusion) = if attempt.held {
            (Kind::Acquired, "holds the lock")
        } else {
            (Kind::GaveUp, "does not get the lock")
        };
        self.stage.record(
            Event::new(client, kind, round_text(conclusion, &attempt))
                .with("owner", attempt.value.clone())
                .with(
                    "attempt",
                    serde_json::to_value(&attempt).unwrap_or_default(),
                ),
        );
        attempt
    }

    fn release(&mut self, client: &str, lock: &mut Redlock, attempt: &Attempt) {
        let answers = lock.release(&attempt.value);
        let deleted = answers.iter().filter(|a| a.reply == Reply::Deleted).count();
        let lines: Vec<String> = answers.iter().map(redlock::answer_line).collect();
        self.stage.record(
            Event::new(
                client,
                Kind::Released,
                format!(
                    "releases on all {} masters ({deleted} still held its value):\n{}",
                    answers.len(),
                    indent(&lines)
                ),
            )
            .with(
                "answers",
                serde_json::to_value(&answers).unwrap_or_default(),
            ),
        );
    }

    /// SIGKILL to one master: down, its port refuses connections until it is restarted.
    fn kill(&mut self, i: usize) -> Result<()> {
        let pid = self
            .server(i)?
            .pid(Backend::Redis)
            .context("a master has no pid")?;
        procs::signal_group(pid, Signal::SIGKILL)?;
        let deadline = Instant::now() + Duration::from_secs(3);
        while procs::process_state(pid).is_some_and(|state| state != 'Z') {
            if Instant::now() > deadline {
                bail!("master {} (pid {pid}) did not die of SIGKILL", Lab::name(i));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.faults[i] = Fault::Down;
        self.stage.record(
            Event::new(
                "lab",
                Kind::Killed,
                format!(
                    "SIGKILL {} (pid {pid}, port {}): down",
                    Lab::name(i),
                    Master::new("", &self.url(i)).port()
                ),
            )
            .with("master", Lab::name(i))
            .with("pid", pid),
        );
        Ok(())
    }

    /// Starts a killed master again — or kills a live one first, as a crash would — on
    /// the same port. Without persistence it comes back empty.
    fn restart(&mut self, i: usize, crash: bool) -> Result<()> {
        let took = self.server(i)?.crash_and_restart(Backend::Redis)?;
        self.faults[i] = Fault::Up;
        let pid = self.server(i)?.pid(Backend::Redis).unwrap_or(0);
        let text = format!(
            "{}{} back on :{} in {}, EMPTY (no persistence)",
            if crash { "SIGKILL, then " } else { "" },
            Lab::name(i),
            Master::new("", &self.url(i)).port(),
            human(took)
        );
        self.stage.record(
            Event::new(
                "lab",
                if crash { Kind::Killed } else { Kind::Resumed },
                text,
            )
            .with("master", Lab::name(i))
            .with("pid", pid)
            .with("restart_ms", took.as_millis() as u64),
        );
        Ok(())
    }

    fn freeze(&mut self, i: usize) -> Result<()> {
        self.server(i)?.freeze(Backend::Redis)?;
        let pid = self.server(i)?.pid(Backend::Redis).unwrap_or(0);
        if !procs::wait_until_stopped(pid, Duration::from_secs(2)) {
            bail!(
                "master {} (pid {pid}) did not stop after SIGSTOP",
                Lab::name(i)
            );
        }
        self.faults[i] = Fault::Frozen;
        self.stage.record(
            Event::new(
                "lab",
                Kind::Frozen,
                format!(
                    "SIGSTOP {} (pid {pid}): accepts connections, answers nothing",
                    Lab::name(i)
                ),
            )
            .with("master", Lab::name(i))
            .with("pid", pid),
        );
        Ok(())
    }

    fn thaw(&mut self, i: usize) -> Result<()> {
        self.server(i)?.thaw(Backend::Redis)?;
        self.faults[i] = Fault::Up;
        self.stage.record(
            Event::new(
                "lab",
                Kind::Resumed,
                format!(
                    "SIGCONT {}: it serves what queued up meanwhile",
                    Lab::name(i)
                ),
            )
            .with("master", Lab::name(i)),
        );
        Ok(())
    }

    /// GET and PTTL of `key` on every master: who holds it where, by the masters' answers.
    fn read_back(&mut self, key: &str, heading: &str) -> Vec<MasterState> {
        let mut states = Vec::new();
        for i in 0..self.n() {
            let mut master = Master::new(&Lab::name(i), &self.url(i));
            let asked = match self.faults[i] {
                Fault::Up => master.read(key, READ_TIMEOUT),
                Fault::Down => Err("down (killed by the lab)".to_string()),
                Fault::Frozen => Err("frozen by the lab: not asked".to_string()),
            };
            let state = match asked {
                Ok((value, pttl)) => MasterState {
                    master: master.name.clone(),
                    port: master.port().to_string(),
                    holder: value.map(|v| self.client_of(&v)),
                    pttl_ms: Some(pttl),
                    answered: true,
                    why: None,
                },
                Err(why) => MasterState {
                    master: master.name.clone(),
                    port: master.port().to_string(),
                    holder: None,
                    pttl_ms: None,
                    answered: false,
                    why: Some(why),
                },
            };
            states.push(state);
        }
        let lines: Vec<String> = states.iter().map(state_line).collect();
        self.stage.record(
            Event::new(
                "masters",
                Kind::HolderNow,
                format!("{heading}:\n{}", indent(&lines)),
            )
            .with("key", key)
            .with("masters", serde_json::to_value(&states).unwrap_or_default()),
        );
        states
    }

    fn client_of(&self, value: &str) -> String {
        self.values
            .iter()
            .find(|(v, _)| v == value)
            .map(|(_, client)| client.clone())
            .unwrap_or_else(|| "other".to_string())
    }

    /// Scenario 1: a minority down, a minority frozen, a majority down.
    fn play_minority(&mut self) -> Result<Vec<ScenarioVerdict>> {
        let (n, q) = (self.n(), self.q());
        // The last n − q masters are the minority; one more makes a majority down.
        let minority: Vec<usize> = (q..n).collect();
        self.heading(
            "minority",
            &format!("1. Survives a minority: {} of {n} masters down", n - q),
        );
        let mut verdicts = Vec::new();

        for &i in &minority {
            self.kill(i)?;
        }
        let key = self.key("minority-down");
        let mut lock = self.lock(&key);
        let down = self.acquire("A", &mut lock);
        let down_read = self.read_back(&key, "the masters, right after A's round");
        if down.held {
            self.release("A", &mut lock, &down);
        }
        for &i in &minority {
            self.restart(i, false)?;
        }
        verdicts.push(ScenarioVerdict {
            name: "minority-down",
            granted: down.held,
            quorum: q,
            validity_ms: down.validity_ms,
            two_holders: None,
            stale_write: None,
            guarded_writes: None,
            left_after_release: None,
            set_once_thawed: None,
            meaning: format!(
                "With {} down (connection refused at once), {} of {n} granted: {}.",
                self.names(minority.clone()),
                down.granted,
                if down.held {
                    "the lock holds, and the dead masters cost almost no validity"
                } else {
                    "not held"
                }
            ),
            rounds: vec![round("A", &down)],
            read_back: down_read,
            simulated: None,
            prevented_by: "nothing needed: a minority down is what Redlock is built for",
        });

        self.note(&format!(
            "{} frozen instead: each costs the {} per-instance timeout",
            self.names(minority.clone()),
            human(self.settings.instance_timeout)
        ));
        for &i in &minority {
            self.freeze(i)?;
        }
        let key = self.key("minority-frozen");
        let mut lock = self.lock(&key);
        let frozen = self.acquire("A", &mut lock);
        let frozen_read = self.read_back(&key, "the masters, right after A's round");
        if frozen.held {
            self.release("A", &mut lock, &frozen);
        }
        // The share of the round spent waiting on the frozen masters, from the same round.
        let waited: f64 = frozen
            .answers
            .iter()
            .filter(|a| matches!(a.reply, Reply::NoAnswer { .. }))
            .map(|a| a.took_ms)
            .sum();
        verdicts.push(ScenarioVerdict {
            name: "minority-frozen",
            granted: frozen.held,
            quorum: q,
            validity_ms: frozen.validity_ms,
            two_holders: None,
            stale_write: None,
            guarded_writes: None,
            left_after_release: None,
            set_once_thawed: None,
            meaning: format!(
                "With {} frozen, {} of {n} granted ({}). Of the round's {:.0}ms, {waited:.0}ms \
                 went on waiting for the frozen masters: validity {}ms.",
                self.names(minority.clone()),
                frozen.granted,
                if frozen.held { "held" } else { "not held" },
                frozen.elapsed_ms,
                frozen.validity_ms
            ),
            rounds: vec![round("A", &frozen)],
            read_back: frozen_read,
            simulated: None,
            prevented_by: "nothing needed; a shorter per-instance timeout costs less validity",
        });

        // One more master down: only a minority can answer.
        let extra = q - 1;
        self.kill(extra)?;
        let key = self.key("majority-down");
        let mut lock = self.lock(&key);
        let failed = self.acquire("A", &mut lock);
        let after = self.read_back(&key, "the masters, after the failed round's release");
        let left: Vec<String> = after
            .iter()
            .filter(|s| s.holder.is_some())
            .map(|s| s.master.clone())
            .collect();
        for &i in &minority {
            self.thaw(i)?;
        }
        self.restart(extra, false)?;
        // What the frozen masters did with the requests queued while they were stopped.
        let woke = self.read_back(&key, "the same key once the frozen masters woke");
        let thawed_holders: Vec<&MasterState> =
            woke.iter().filter(|s| s.holder.is_some()).collect();
        let late: Vec<String> = thawed_holders
            .iter()
            .map(|s| format!("{} ({}ms left)", s.master, s.pttl_ms.unwrap_or_default()))
            .collect();
        let set_once_thawed = thawed_holders.iter().map(|s| s.master.clone()).collect();
        let answering: Vec<usize> = (0..n)
            .filter(|i| *i != extra && !minority.contains(i))
            .collect();
        verdicts.push(ScenarioVerdict {
            name: "majority-down",
            granted: failed.held,
            quorum: q,
            validity_ms: failed.validity_ms,
            two_holders: None,
            stale_write: None,
            guarded_writes: None,
            meaning: format!(
                "With {} down and {} frozen, {} of {n} granted: {}. Right after the release on \
                 all {n}, {}.{}",
                Lab::name(extra),
                self.names(minority.clone()),
                failed.granted,
                if failed.held { "held" } else { "not held, and the release was sent to every master" },
                if left.is_empty() {
                    format!("no master that answered ({}) kept its key", self.names(answering))
                } else {
                    format!("{} still held it", left.join(", "))
                },
                if late.is_empty() {
                    " Once thawed, no master held it either: released everywhere.".to_string()
                } else {
                    format!(
                        " Once thawed, {} set the key after all (a request that timed out still \
                         landed), so it was not released everywhere: only its TTL removes it.",
                        late.join(", ")
                    )
                }
            ),
            left_after_release: Some(left),
            set_once_thawed: Some(set_once_thawed),
            rounds: vec![round("A", &failed)],
            read_back: after,
            simulated: None,
            prevented_by: "nothing to prevent: no majority, no lock (availability lost, not safety)",
        });
        Ok(verdicts)
    }

    /// Scenario 2: a master restarting empty hands out the lock twice; kept down longer
    /// than the TTL, it does not.
    fn play_restart(&mut self) -> Result<Vec<ScenarioVerdict>> {
        let (n, q) = (self.n(), self.q());
        // A gets the first q masters: the others are down while A asks.
        let others: Vec<usize> = (q..n).collect();
        let crashing = q - 1;
        self.heading(
            "restart",
            &format!("2. A master restarts empty: A holds {}", self.names(0..q)),
        );
        let mut verdicts = Vec::new();

        for &i in &others {
            self.kill(i)?;
        }
        let key = self.key("restart-empty");
        let mut a_lock = self.lock(&key);
        let a = self.acquire("A", &mut a_lock);
        for &i in &others {
            self.restart(i, false)?;
        }
        self.restart(crashing, true)?;
        let (mut b_lock, b, read, two) = self.b_asks(&key, &a);
        if a.held {
            self.release("A", &mut a_lock, &a);
        }
        if b.held {
            self.release("B", &mut b_lock, &b);
        }
        verdicts.push(ScenarioVerdict {
            name: "restart-empty",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            stale_write: None,
            guarded_writes: None,
            left_after_release: None,
            set_once_thawed: None,
            meaning: format!(
                "A was granted by {} of {n}. {} came back empty and, with {}, granted B {} of \
                 {n}: {}",
                a.granted,
                Lab::name(crashing),
                self.names(others.clone()),
                b.granted,
                if two {
                    "two holders at once, while A's validity still ran. No client paused."
                } else {
                    "B was not granted while A's validity ran."
                }
            ),
            rounds: vec![round("A", &a), round("B", &b)],
            read_back: read,
            simulated: None,
            prevented_by: "a master that keeps its keys across the crash — for this SIGKILL, \
                           appendonly yes with the default appendfsync everysec (an acknowledged \
                           SET has reached the page cache); for a power loss, appendfsync \
                           always — or one that stays down longer than the longest TTL",
        });

        self.note(&format!(
            "again, but a crashed master stays down longer than the TTL ({}) before it rejoins",
            human(self.settings.ttl)
        ));
        for &i in &others {
            self.kill(i)?;
        }
        let key = self.key("restart-delayed");
        let mut a_lock = self.lock(&key);
        let a = self.acquire("A", &mut a_lock);
        for &i in &others {
            self.restart(i, false)?;
        }
        self.kill(crashing)?;
        let crashed_at = Instant::now();
        let (_, b, read, two) = self.b_asks(&key, &a);
        // The delay the algorithm's author proposes: longer than the longest TTL.
        let delay = self.settings.ttl + Duration::from_millis(200);
        if let Some(left) = (crashed_at + delay).checked_duration_since(Instant::now()) {
            std::thread::sleep(left);
        }
        self.restart(crashing, false)?;
        let rejoined = self.read_back(&key, "the masters once it has rejoined");
        let a_keys_left = rejoined
            .iter()
            .filter(|s| s.holder.as_deref() == Some("A"))
            .count();
        if a.held {
            self.release("A", &mut a_lock, &a);
        }
        verdicts.push(ScenarioVerdict {
            name: "restart-delayed",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            stale_write: None,
            guarded_writes: None,
            left_after_release: None,
            set_once_thawed: None,
            meaning: format!(
                "With {} kept down for {}, B got {} of {n}: {}. {}",
                Lab::name(crashing),
                human(delay),
                b.granted,
                if b.held { "granted" } else { "refused" },
                if a_keys_left == 0 {
                    "When it rejoined, no master held A's key any more: an empty master could \
                     no longer hand the lock out twice."
                        .to_string()
                } else {
                    format!("When it rejoined, {a_keys_left} master(s) still held A's key.")
                }
            ),
            rounds: vec![round("A", &a), round("B", &b)],
            read_back: read,
            simulated: None,
            prevented_by: "this is the prevention (a delayed restart); it costs availability",
        });
        Ok(verdicts)
    }

    /// Scenario 3: clocks jumping forward on some masters (simulated), the key expiring
    /// early there, and B getting a majority.
    fn play_clock_jump(&mut self) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        let last = n - 1;
        // A gets every master but the last; q − 1 of A's then lose the key early, which
        // leaves A a minority and gives B those q − 1 plus the last: a majority.
        let jumping: Vec<usize> = (n - q..last).collect();
        self.heading(
            "clock-jump",
            &format!(
                "3. A clock jumps forward on {} (SIMULATED)",
                self.names(jumping.clone())
            ),
        );
        let key = self.key("clock-jump");
        let own = !self.private.is_empty();
        if own {
            self.kill(last)?;
        } else {
            self.stand_in(last, &key)?;
        }
        let mut a_lock = self.lock(&key);
        let a = self.acquire("A", &mut a_lock);
        if own {
            self.restart(last, false)?;
        } else {
            self.stand_in_gone(last, &key)?;
        }
        let jump = self.settings.ttl;
        for &i in &jumping {
            self.simulate_jump(i, &key, jump)?;
        }
        let (mut b_lock, b, read, two) = self.b_asks(&key, &a);
        if a.held {
            self.release("A", &mut a_lock, &a);
        }
        if b.held {
            self.release("B", &mut b_lock, &b);
        }
        Ok(ScenarioVerdict {
            name: "clock-jump",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            stale_write: None,
            guarded_writes: None,
            left_after_release: None,
            set_once_thawed: None,
            meaning: format!(
                "A was granted by {} of {n}. The (simulated) {} jump on {} expired A's key \
                 there early; B then got {} of {n}: {}",
                a.granted,
                human(jump),
                self.names(jumping.clone()),
                b.granted,
                if two {
                    "two holders at once, while A's validity still ran on A's own clock."
                } else {
                    "B was not granted while A's validity ran."
                }
            ),
            rounds: vec![round("A", &a), round("B", &b)],
            read_back: read,
            simulated: Some(
                "the clock jump: the key's PTTL was shortened by the jump with PEXPIRE on the \
                 jumping masters (redis-server crashes under libfaketime); everything else is real",
            ),
            prevented_by: "masters whose expiry cannot jump (no stepped clocks: slew only), \
                           i.e. the timing assumption Redlock rests on",
        })
    }

    /// On a master of the user's, which the lab never kills: the lab takes the key there
    /// first, so the master refuses A's round (as a down one would not grant it).
    fn stand_in(&mut self, i: usize, key: &str) -> Result<()> {
        let value = format!("lockslab-stand-in-{}", self.run_id);
        let mut master = Master::new(&Lab::name(i), &self.url(i));
        let _: Option<String> = master
            .command(
                redis::cmd("SET")
                    .arg(key)
                    .arg(&value)
                    .arg("PX")
                    .arg(self.settings.ttl.as_millis() as u64),
                READ_TIMEOUT,
            )
            .map_err(|why| {
                anyhow::anyhow!("Redis master {} did not answer SET: {why}", Lab::name(i))
            })?;
        self.values.push((value, "lab".into()));
        self.note(&format!(
            "{} is yours, not the lab's to kill: the lab sets the key there first, so it \
             refuses A",
            Lab::name(i)
        ));
        Ok(())
    }

    fn stand_in_gone(&mut self, i: usize, key: &str) -> Result<()> {
        let mut master = Master::new(&Lab::name(i), &self.url(i));
        let _: i64 = master
            .command(redis::cmd("DEL").arg(key), READ_TIMEOUT)
            .map_err(|why| {
                anyhow::anyhow!("Redis master {} did not answer DEL: {why}", Lab::name(i))
            })?;
        self.note(&format!(
            "deletes its stand-in key on {}: it answers for itself again",
            Lab::name(i)
        ));
        Ok(())
    }

    /// What a forward jump of a master's clock does to a key's expiry, done to the key:
    /// PTTL shortened by `jump` (a key with less left than that expires at once).
    fn simulate_jump(&mut self, i: usize, key: &str, jump: Duration) -> Result<()> {
        let mut master = Master::new(&Lab::name(i), &self.url(i));
        let before: i64 = master
            .command(redis::cmd("PTTL").arg(key), READ_TIMEOUT)
            .map_err(|why| {
                anyhow::anyhow!("Redis master {} did not answer PTTL: {why}", Lab::name(i))
            })?;
        let after = before - jump.as_millis() as i64;
        // PEXPIRE with zero or less deletes the key, as an expiry in the past would.
        let _: i64 = master
            .command(
                redis::cmd("PEXPIRE").arg(key).arg(after.max(0)),
                READ_TIMEOUT,
            )
            .map_err(|why| {
                anyhow::anyhow!(
                    "Redis master {} did not answer PEXPIRE: {why}",
                    Lab::name(i)
                )
            })?;
        let (_, now) = master.read(key, READ_TIMEOUT).map_err(|why| {
            anyhow::anyhow!("Redis master {} did not answer: {why}", Lab::name(i))
        })?;
        self.stage.record(
            Event::new(
                "masters",
                Kind::Expired,
                format!(
                    "SIMULATED: {}'s clock jumps {} ahead → PEXPIRE: PTTL {before}ms → {}",
                    Lab::name(i),
                    human(jump),
                    if now == -2 {
                        "key expired".to_string()
                    } else {
                        format!("{now}ms")
                    }
                ),
            )
            .with("master", Lab::name(i))
            .with("simulated", true)
            .with("jump_ms", jump.as_millis() as u64)
            .with("pttl_before_ms", before)
            .with("pttl_after_ms", now),
        );
        Ok(())
    }

    /// B's round on `key` after A's: its lock, its attempt, the masters read back right
    /// after it, and whether both held a majority's grant at that moment (said on screen).
    fn b_asks(&mut self, key: &str, a: &Attempt) -> (Redlock, Attempt, Vec<MasterState>, bool) {
        let mut b_lock = self.lock(key);
        let b = self.acquire("B", &mut b_lock);
        let b_granted_at = Instant::now();
        let read = self.read_back(key, "the masters, right after B's round");
        let two = two_holders(a, &b, b_granted_at);
        self.say_two_holders(two, a, b_granted_at);
        (b_lock, b, read, two)
    }

    fn say_two_holders(&mut self, two: bool, a: &Attempt, b_granted_at: Instant) {
        let left = a
            .valid_until()
            .map(|end| end.saturating_duration_since(b_granted_at).as_millis() as i64)
            .unwrap_or(0);
        if two {
            self.stage.record(
                Event::new(
                    "masters",
                    Kind::TwoHolders,
                    format!("TWO HOLDERS: B holds a majority, A's validity has {left}ms to run"),
                )
                .with("a_validity_left_ms", left),
            );
        }
    }

    /// Scenario 4: the client pauses past its validity. Redlock cannot help; a fencing
    /// token from an ordered, durable source can, its random value cannot.
    fn play_client_pause(&mut self, store_url: &str, sequence: &str) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        self.heading(
            "client-pause",
            "4. The client pauses (SIGSTOP) past its validity",
        );
        let mut store = Store::connect(store_url)?;
        store.prepare()?;
        store.create_token_sequence(sequence)?;
        let key = self.key("client-pause");
        let resources = Resources {
            unfenced: "redlock-unfenced".into(),
            claimed: "redlock-claimed".into(),
            late_claim: "redlock-claimed-late".into(),
            sequence: "redlock-by-sequence".into(),
        };
        let script = RedlockClientScript {
            name: "A".into(),
            masters: (0..n).map(|i| (Lab::name(i), self.url(i))).collect(),
            key: key.clone(),
            ttl_ms: self.settings.ttl.as_millis() as u64,
            drift_factor: self.settings.drift_factor,
            instance_timeout_ms: self.settings.instance_timeout.as_millis() as u64,
            retry_delay_max_ms: self.settings.retry_delay_max.as_millis() as u64,
            wait_ms: 10_000,
            store_url: store_url.into(),
            run_id: self.run_id.clone(),
            token_sequence: sequence.into(),
            resources: resources.clone(),
        };
        let mut a = self.stage.spawn("A", &WorkerSpec::RedlockClient(script))?;
        let long = self.settings.ttl + Duration::from_secs(15);
        let acquired = self
            .stage
            .wait_for(long, "A to take the lock", |e| e.is("A", Kind::Acquired))?;
        // A's round ended before this moment, so its validity ends before `a_seen + validity`.
        let a_seen = Instant::now();
        let a_value = acquired.get_str("owner").unwrap_or_default().to_string();
        let a_validity = acquired.get_i64("validity_ms").unwrap_or_default();
        self.values.push((a_value.clone(), "A".into()));
        self.stage
            .wait_for(long, "A to freeze itself", |e| e.is("A", Kind::Freezing))?;
        if !procs::wait_until_stopped(a.pid, Duration::from_secs(2)) {
            bail!("worker A (pid {}) said it would stop but did not", a.pid);
        }
        let frozen_at = Instant::now();
        self.stage.record(
            Event::new(
                "lab",
                Kind::Frozen,
                format!(
                    "sees A (pid {}) stopped; its validity was {a_validity}ms",
                    a.pid
                ),
            )
            .with("pid", a.pid),
        );
        // Until no master holds A's value: each expires it by its own clock.
        let deadline = Instant::now() + long;
        loop {
            let mut holding = 0;
            for i in 0..n {
                let mut master = Master::new(&Lab::name(i), &self.url(i));
                if let Ok((Some(value), _)) = master.read(&key, READ_TIMEOUT)
                    && value == a_value
                {
                    holding += 1;
                }
            }
            if holding == 0 {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "A's key did not expire on the masters within {}",
                    human(long)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stage.record(Event::new(
            "masters",
            Kind::Expired,
            format!("A's key has expired on all {n} masters, each by its own clock"),
        ));
        let mut b_lock = self.lock(&key);
        let mut b_asked = Instant::now();
        let mut b = self.acquire("B", &mut b_lock);
        let retry_until = Instant::now() + Duration::from_secs(5);
        while !b.held && Instant::now() < retry_until {
            std::thread::sleep(redlock::random_delay(self.settings.retry_delay_max));
            b_asked = Instant::now();
            b = self.acquire("B", &mut b_lock);
        }
        if !b.held {
            bail!("B did not get the lock after A's key expired everywhere");
        }
        // B's round started after A's validity ended (proved on this process's clock), or
        // the lab cannot tell: it never says "granted twice" without the evidence.
        let a_validity_ended = a_seen + Duration::from_millis(a_validity.max(0) as u64);
        let granted_twice = (b_asked >= a_validity_ended).then_some(false);
        let b_token = store.next_token(sequence)?;
        for resource in [&resources.claimed, &resources.late_claim] {
            store.claim(&self.run_id, resource, "B", &b.value);
        }
        self.stage.record(Event::new(
            "B",
            Kind::Working,
            format!(
                "token {b_token} from the sequence; claims {} and {} with its value",
                resources.claimed, resources.late_claim
            ),
        ));
        for (resource, guard) in resources.guarded(&b.value, b_token) {
            let outcome = guard.write(&mut store, &self.run_id, resource, "B", "B's result");
            self.stage.record(
                Event::new(
                    "B",
                    Kind::Wrote,
                    format!(
                        "writes 'B's result' to {resource} ({}): the store says {}",
                        guard.how(),
                        outcome.as_str()
                    ),
                )
                .with("resource", resource)
                .with("outcome", outcome.as_str())
                .with("token", guard.token()),
            );
        }
        a.resume()?;
        self.stage.record(Event::new(
            "lab",
            Kind::Resumed,
            format!("sends SIGCONT to A after {}", human(frozen_at.elapsed())),
        ));
        self.stage
            .wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        a.finish(Duration::from_secs(5));
        self.release("B", &mut b_lock, &b);
        self.stage.drain();

        let mut rows = Vec::new();
        for (guard, resource) in [
            ("unfenced", &resources.unfenced),
            ("claim", &resources.claimed),
            ("late_claim", &resources.late_claim),
            ("sequence", &resources.sequence),
        ] {
            let read = store.read_back(&self.run_id, resource)?;
            if !check::last_accepted_is_final(&read.attempts, read.final_writer.as_deref()) {
                bail!("the store's record for {resource} disagrees with itself");
            }
            let late = check::late_write(&read.attempts, "A", "B");
            let row = GuardedWrite {
                guard,
                resource: resource.clone(),
                stale: StaleWrite {
                    attempted: late.attempted(),
                    accepted: late.accepted(),
                    a_token: read.last_token_of("A"),
                    b_token: read.last_token_of("B"),
                },
                final_writer: read.final_writer,
            };
            if let Some(accepted) = row.stale.accepted {
                let (kind, verb) = if accepted {
                    (Kind::StaleWriteAccepted, "took")
                } else {
                    (Kind::StaleWriteRejected, "refused")
                };
                self.stage.record(
                    Event::new(
                        "store",
                        kind,
                        format!(
                            "{}: decided A's stale write after B's and {verb} it; it holds {}'s result",
                            guard_label(guard),
                            row.final_writer.as_deref().unwrap_or("nobody")
                        ),
                    )
                    .with("guard", guard),
                );
            }
            rows.push(row);
        }
        let read = self.read_back(&key, "the masters at the end");
        let took = |row: &GuardedWrite| match row.stale.accepted {
            Some(true) => "took",
            Some(false) => "refused",
            None => "never saw",
        };
        let [unfenced, claim, late_claim, by_sequence] = &rows[..] else {
            bail!("four resources were written, {} read back", rows.len());
        };
        let token = |t: Option<i64>| t.map(|t| t.to_string()).unwrap_or("?".into());
        let stale_write = Some(unfenced.stale.clone());
        let meaning = format!(
            "A froze past its {a_validity}ms validity; B was granted {} of {n} once A's key \
             expired everywhere: {}. A woke still believing it held the lock and wrote: a stale \
             writer. Unfenced, the store {} A's write. Claimed by value at the grant \
             (antirez), it {} it: B's claim had replaced A's. Claimed by value after the pause \
             (Kleppmann), it {} it: A's late claim displaced B's, and the resource cannot tell \
             which claim is older (and a resource that can compare-and-set atomically could \
             itself have been the lock). By the sequence (token {} < {}) it {} it.",
            b.granted,
            match granted_twice {
                Some(false) =>
                    "B's round began after A's validity had ended, so the lock was \
                                never granted twice within validity",
                _ => "the lab's clock cannot order B's grant against the end of A's validity",
            },
            took(unfenced),
            took(claim),
            took(late_claim),
            token(by_sequence.stale.a_token),
            token(by_sequence.stale.b_token),
            took(by_sequence),
        );
        Ok(ScenarioVerdict {
            name: "client-pause",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: granted_twice,
            stale_write,
            meaning,
            guarded_writes: Some(rows),
            left_after_release: None,
            set_once_thawed: None,
            rounds: vec![round("B", &b)],
            read_back: read,
            simulated: None,
            prevented_by: "a fencing token from an ordered, durable source (a Postgres \
                           sequence, an etcd revision) checked by the store; not Redlock, and \
                           not its random value, even compare-and-set",
        })
    }
}

/// A guard's row label in the verdict and the store's lines.
fn guard_label(guard: &str) -> &'static str {
    match guard {
        "unfenced" => "unfenced",
        "claim" => "value claimed at the grant (antirez)",
        "late_claim" => "value claimed after the pause (Kleppmann)",
        _ => "token from a Postgres sequence",
    }
}

/// Both clients were granted a majority, and B's grant came before A's validity ended —
/// both on this process's monotonic clock, where both rounds ran.
fn two_holders(a: &Attempt, b: &Attempt, b_granted_at: Instant) -> bool {
    a.held && b.held && a.valid_until().is_some_and(|end| b_granted_at < end)
}

fn round(client: &str, attempt: &Attempt) -> ClientRound {
    ClientRound {
        client: client.to_string(),
        attempt: attempt.clone(),
    }
}

fn state_line(state: &MasterState) -> String {
    let what = match (&state.holder, state.pttl_ms, state.answered) {
        (_, _, false) => format!("✗ {}", state.why.as_deref().unwrap_or("no answer")),
        (Some(holder), Some(pttl), _) => format!("{holder}'s value, PTTL {pttl}ms"),
        (None, _, _) => "no key".to_string(),
        (Some(holder), None, _) => format!("{holder}'s value"),
    };
    format!("{:<3} :{:<5} {what}", state.master, state.port)
}

fn print_verdicts(verdicts: &[ScenarioVerdict], skipped: &[Scenario]) {
    let yes_no = |b: Option<bool>| match b {
        Some(true) => "YES".red().bold().to_string(),
        Some(false) => "no".to_string(),
        None => "–".to_string(),
    };
    let stale = |s: Option<&StaleWrite>| match s {
        None => "–".to_string(),
        Some(s) => match s.accepted {
            Some(true) => "ACCEPTED".red().bold().to_string(),
            Some(false) => "rejected".green().bold().to_string(),
            None => "none".to_string(),
        },
    };
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            let granted = v
                .rounds
                .last()
                .map(|r| format!("{}/{}", r.attempt.granted, r.attempt.answers.len()))
                .unwrap_or_default();
            vec![
                v.name.to_string(),
                format!("{} {granted}", if v.granted { "yes" } else { "no" }),
                yes_no(v.two_holders),
                stale(v.stale_write.as_ref()),
            ]
        })
        .chain(skipped.iter().map(|s| {
            let mut row = vec![s.command_name().to_string(), "skipped".to_string()];
            row.extend(std::iter::repeat_n("–".to_string(), 2));
            row
        }))
        .collect();
    crate::outln!();
    crate::outln!("{}", "Verdict".bold());
    crate::outln!(
        "{}",
        table(
            &[
                "scenario",
                "granted",
                "granted twice within validity",
                "stale write"
            ],
            &rows
        )
    );
    for verdict in verdicts {
        let Some(guarded) = &verdict.guarded_writes else {
            continue;
        };
        let rows: Vec<Vec<String>> = guarded
            .iter()
            .map(|g| {
                vec![
                    guard_label(g.guard).to_string(),
                    stale(Some(&g.stale)),
                    g.final_writer.clone().unwrap_or("nobody".into()),
                ]
            })
            .collect();
        crate::outln!();
        crate::outln!(
            "  {}: A's stale write, resource by resource (read back from the store)",
            verdict.name
        );
        crate::outln!(
            "{}",
            table(&["guard", "A's late write", "result kept"], &rows)
        );
    }
    crate::outln!();
    for verdict in verdicts {
        let text = format!("{}: {}", verdict.name, verdict.meaning);
        for line in crate::output::wrap(&text, 76) {
            crate::outln!("  {line}");
        }
        for line in crate::output::wrap(&format!("prevented by: {}", verdict.prevented_by), 74) {
            crate::outln!("    {}", line.dimmed());
        }
    }
    for scenario in skipped {
        let text = format!(
            "{}: skipped. It needs masters lockslab starts itself (it kills, freezes and \
             restarts them); run it without --master.",
            scenario.command_name()
        );
        for line in crate::output::wrap(&text, 76) {
            crate::outln!("  {line}");
        }
    }
}

//! `lockslab challenge`: a learner brings a lock client of their own, in any language;
//! lockslab runs it as several processes on real servers, plays the challenge's faults at
//! it, and grades what it did to the data — read from the database's own log of changes.
//!
//! ```text
//! PROGRAM ×3 <── init, jobs (stdin) ── play ──> nemesis (pause, kill: Schedule + Player)
//!         ──> ready, notes, ok/fail ──>  │
//!         ──> Redis, etcd, Postgres      └──> table::read_back ──> check::challenge ──> grade
//! ```
//!
//! The protocol is in [`protocol`] and docs/challenge.md; the challenges and their faults
//! in [`challenges`]; one run in [`play`]; the grader in [`crate::check::challenge`].

pub mod challenges;
mod client;
mod credentials;
pub mod isolation;
mod play;
pub mod protocol;
mod reaper;
mod table;
mod verdict;

use std::time::Duration;

use anyhow::{Context, Result};

use crate::check::challenge::{Evidence, Grade, LogBack};
use crate::connect::{self, Backend};
use crate::events::{Event, What};
use crate::exit::Exit;
use crate::labs::leftovers::Leftovers;
use crate::servers::{self, ServerArgs};
use challenges::Challenge;
use protocol::Init;

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab challenge list               the challenges, their faults, targets
  lockslab challenge counter --template python > client.py
                                        a client that speaks the protocol and
                                        takes no lock at all: start from it
  lockslab challenge counter -- /usr/bin/python3 client.py
  lockslab challenge pause --seed 7 -- /usr/bin/python3 client.py
                                        the same faults as the run of seed 7
  lockslab challenge crash --json -- ./target/release/my-client --fast
  lockslab challenge delay --html run.html -- /usr/bin/python3 client.py
                                        the run's timeline as a page
  lockslab challenge failover -- /usr/bin/python3 client.py
                                        the Redis primary dies mid-run: init
                                        names the Sentinels that know the next
  lockslab challenge pause --isolated -- /usr/bin/python3 /srv/client/client.py
                                        a client you do not trust: refuse to
                                        run unless it is isolated

The program is started as 3 clients (and one more for each one killed), each
in a session of its own with no terminal and a scrubbed environment: as root,
as a user of the run's own (its files must be readable by every user); else in
a bwrap sandbox when bwrap is installed; else as you (the heading says so). It reads one JSON object a line on stdin (init,
then jobs), answers on stdout (ready, then ok or fail per job; optional notes
acquired, writing, released), and logs on stderr. Protocol: docs/challenge.md.
Walkthrough: labs/11-challenge.md.

", crate::exit_status_help!(
    done: "pass",
    violation: "fail (the data shows a lost, doubled or stale write, or a fencing token \
that went back; or the client crashed, hung, flooded or printed garbage)",
    undecided: "unknown (a fault never played, or played and missed: no write of a job was \
held up past the TTL)"
), " A client that exits before any said ready: it could not run (4)."))]
pub struct ChallengeArgs {
    /// The challenge: counter, pause, crash, delay, exactly-once or failover (`list` to
    /// see them)
    #[arg(value_name = "NAME", default_value = "list", hide_default_value = true)]
    pub name: String,
    /// Print a starting client in this language, and exit
    #[arg(long, value_name = "LANG", value_parser = ["python", "rust"])]
    pub template: Option<String>,
    /// Draw the jobs and the faults from this seed (printed when not given). A seed you
    /// give is one a client could guess from its jobs: a grade that counts uses a drawn one
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// How many clients at once
    #[arg(long, default_value_t = verdict::DEFAULT_CLIENTS, value_parser = clap::value_parser!(u32).range(2..=8))]
    pub clients: u32,
    /// The lock's TTL the faults are built around (the client is told it)
    #[arg(long, default_value = "500ms", value_parser = crate::flags::parse_duration,
          value_name = "T")]
    pub ttl: std::time::Duration,
    /// How long a client may take to say ready, or to answer one job [default: 10s, or
    /// 3 TTLs and the challenge's longest wait behind its faults when that is longer]
    #[arg(long, value_parser = crate::flags::parse_duration, value_name = "T")]
    pub patience: Option<std::time::Duration>,
    /// JSON Lines on stdout: the run's events, then a verdict
    #[arg(long)]
    pub json: bool,
    /// Draw the run's timeline and verdict to this HTML page
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
    /// Refuse to run unless the clients are isolated from lockslab (as root: a user of
    /// their own; else a bwrap sandbox): for grading a client you do not trust
    #[arg(long)]
    pub isolated: bool,
    /// The client to run, and its arguments (after `--`)
    #[arg(last = true, value_name = "PROGRAM")]
    pub program: Vec<String>,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// The records of a run in `schema` — each at 0 — with the log of changes, the log of
/// statements and the functions a proxy tries a caught write with: what the proxy tests
/// exercise against, the very tables a run grades from.
pub fn create_records_for_tests(
    url: &str,
    schema: &str,
    records: &[String],
) -> Result<crate::proxy::Probe> {
    let mut db = crate::connect::postgres(url)?;
    table::create(&mut db, schema, records)?;
    table::create_statement_log(&mut db, schema)?;
    Ok(table::try_probe(schema))
}

/// `lockslab challenge …`.
pub fn run(args: &ChallengeArgs) -> Result<Exit> {
    let challenge = Challenge::ALL.into_iter().find(|c| c.name() == args.name);
    if challenge.is_none() && args.name != "list" {
        crate::bail_usage!(
            "no challenge '{}' (there are: list, {})",
            args.name,
            Challenge::ALL.map(|c| c.name()).join(", ")
        );
    }
    // The template is the same for every challenge: no name needed.
    if let Some(language) = &args.template {
        crate::output::line(verdict::template(language));
        return Ok(Exit::Done);
    }
    let Some(challenge) = challenge else {
        verdict::list();
        return Ok(Exit::Done);
    };
    if args.program.is_empty() {
        crate::bail_usage!(
            "name the client to run after `--`: lockslab challenge {} -- /usr/bin/python3 client.py",
            challenge.name()
        );
    }
    refuse_a_missing_file(&args.program)?;
    let isolation = isolation::Isolation::choose(&args.program)?;
    if args.isolated && !isolation.is_isolated() {
        return Err(anyhow::anyhow!(
            "--isolated: the clients cannot be isolated here ({}); install bubblewrap \
             (`sudo apt-get install bubblewrap`) or run as root, or leave out --isolated",
            isolation.why_not().unwrap_or_default()
        ));
    }
    let lease_ms = args.ttl.as_millis() as u64;
    if !(100..=10_000).contains(&lease_ms) {
        crate::bail_usage!("--ttl: between 100ms and 10s");
    }
    let patience = patience_of(challenge, args)?;
    let picture = crate::picture::Target::html_page(args.html.as_deref())?;
    grade(challenge, args, lease_ms, patience, picture, isolation)
}

/// How long a client may take when `--patience` is not given.
const PATIENCE: Duration = Duration::from_secs(10);

/// How long a client may take to answer: a client that waits rightly for a lock whose
/// holder was frozen may wait out that fault (and the next, on the same record), then the
/// lock's TTL, then its own tries — so never less than 3 TTLs and the challenge's longest
/// wait.
fn patience_of(challenge: Challenge, args: &ChallengeArgs) -> Result<Duration> {
    let least = 3 * args.ttl + challenge.longest_wait(args.ttl);
    let Some(patience) = args.patience else {
        return Ok(least.max(PATIENCE));
    };
    if patience > Duration::from_secs(600) {
        crate::bail_usage!("--patience: at most 10m");
    }
    if patience < least {
        // Short: a usage error is printed as it is, on one line.
        crate::bail_usage!(
            "--patience: at least {} here (3 TTLs + the longest wait behind faults)",
            crate::flags::flag_duration(least)
        );
    }
    Ok(patience)
}

/// Arguments that name a file to run: the program itself when it is a path, and the first
/// script among its arguments.
const SCRIPTS: &[&str] = &[
    ".py", ".rb", ".js", ".mjs", ".ts", ".pl", ".php", ".sh", ".lua",
];

/// The files a client's command names: the program itself when it is a path, and the first
/// script among its arguments. Paths count from the directory lockslab runs in.
pub(crate) fn named_files(program: &[String]) -> Vec<String> {
    let script = program
        .iter()
        .skip(1)
        .find(|arg| SCRIPTS.iter().any(|ext| arg.ends_with(ext)));
    let path_like = program.first().filter(|p| p.contains('/'));
    path_like.into_iter().chain(script).cloned().collect()
}

/// A program, or its script, that is not there: said before any server starts, not as a
/// client that dies at once. Paths count from the directory lockslab runs in.
fn refuse_a_missing_file(program: &[String]) -> Result<()> {
    for file in named_files(program) {
        let file = &file;
        if !std::path::Path::new(file).exists() {
            let here = std::env::current_dir().unwrap_or_default();
            // Built from a checkout: the examples are still where they were built from.
            let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
            if root.join(file).exists() {
                crate::bail_usage!(
                    "{file}: no such file (from {}); the examples' paths count from the \
                     repository's root: run from {}, or give {}",
                    here.display(),
                    root.display(),
                    root.join(file).display()
                );
            }
            crate::bail_usage!(
                "{file}: no such file (from {}; the examples' paths count from the \
                 repository's root)",
                here.display()
            );
        }
    }
    Ok(())
}

/// Takes the run's Redis and etcd users back when the run returns, verdict or error; an
/// interrupt exits without unwinding, so `grade` registers the same removal with
/// [`crate::procs::on_interrupt`] as well.
struct RemoveOnDrop<'a>(&'a credentials::ClientLogins);

impl Drop for RemoveOnDrop<'_> {
    fn drop(&mut self) {
        self.0.remove();
    }
}

fn grade(
    challenge: Challenge,
    args: &ChallengeArgs,
    lease_ms: u64,
    patience: Duration,
    picture: Option<crate::picture::Target>,
    isolation: isolation::Isolation,
) -> Result<Exit> {
    let seed = args.seed.unwrap_or_else(crate::seed::fresh_unguessable);
    let servers = servers::provide(
        &args.servers,
        &[Backend::Redis, Backend::Etcd, Backend::Postgres],
    )?;
    // Failover's Redis: a primary, its replica and three Sentinels of the run's own.
    let mut sentinels = (challenge == Challenge::Failover)
        .then(crate::cluster::SentinelCluster::start)
        .transpose()?;
    let run_id = crate::labs::new_run_id();
    let schema = table::schema_of(&run_id);
    let postgres = servers.url(Backend::Postgres).to_string();
    // The records and their log belong to the grader's role: Postgres's superuser when
    // lockslab started that Postgres, else the role it was given. The clients get a role of
    // the run's own that may only read and update the records (see
    // `table::create_client_role`): they cannot rewrite the log they are graded from, nor
    // end the grader's connections. A given role that may not create roles is shared.
    let owner = servers
        .postgres_admin_url()
        .unwrap_or_else(|| postgres.clone());
    let removal = Leftovers::of_run(&run_id)
        .redis(servers.url(Backend::Redis))
        .sql(&owner, &table::drop_sql(&run_id))
        .removed_at_the_end();
    let records: Vec<String> = (0..2).map(|i| format!("r{i}")).collect();
    let mut db = connect::postgres(&owner)?;
    table::create(&mut db, &schema, &records)?;
    table::create_statement_log(&mut db, &schema)?;
    let role = table::client_role_of(&run_id);
    let client_role = table::create_client_role(&mut db, &schema, &role, &postgres)?;
    // Where writes are tried (`pause`, `delay`), the tries are kept from the clients' sight.
    if challenge.proxied() && client_role.is_some() && servers.postgres_admin_url().is_some() {
        db.batch_execute(table::HIDE_THE_TRIES)
            .context("hiding the tries of held writes from the clients")?;
    }
    let shared = client_role.is_none();
    let unguarded = client_role.as_ref().is_some_and(|r| !r.makes_tables_only());
    // Each client's own login replaces this as it starts (see `play::Run::start_client`).
    let clients_url = postgres.clone();
    let key_prefix = format!("lockslab:{run_id}:");
    let logins = credentials::ClientLogins::make(
        servers.url(Backend::Redis),
        servers.url(Backend::Etcd),
        &run_id,
        &key_prefix,
    );
    let _remove_logins = RemoveOnDrop(&logins);
    let _remove_logins_if_interrupted = crate::procs::on_interrupt({
        let logins = logins.clone();
        move || logins.remove()
    });
    let mut setup = play::Setup {
        challenge,
        program: args.program.clone(),
        clients: args.clients as usize,
        seed,
        init: Init {
            client: String::new(),
            redis_url: logins.redis_url.clone(),
            etcd_url: logins.etcd_url.clone(),
            postgres_url: clients_url,
            table: format!("{schema}.records"),
            schema: schema.clone(),
            key_prefix,
            lease_ms,
            sentinels: sentinels
                .iter()
                .flat_map(|c| &c.sentinels)
                .map(|s| s.addr())
                .collect(),
            master_name: sentinels
                .as_ref()
                .map(|_| crate::cluster::MASTER_NAME.into()),
            redis_password: sentinels.as_ref().map(|c| c.password.clone()),
            etcd_tls: crate::connect::etcd_tls_line(&logins.etcd_url),
        },
        jobs: challenge.draw_jobs(seed, &records),
        json: args.json,
        patience,
        run_id: run_id.clone(),
        grader_url: owner.clone(),
        client_role,
        admin_redis: servers.url(Backend::Redis).to_string(),
        admin_etcd: servers.url(Backend::Etcd).to_string(),
        replay: verdict::replay_words(
            challenge,
            seed,
            args.clients,
            args.ttl,
            args.patience,
            &args.program,
        ),
        isolation,
    };
    if !args.json {
        verdict::heading(
            &setup,
            &run_id,
            &servers,
            shared,
            unguarded,
            logins.shared(),
        );
        if let Some(cluster) = &sentinels {
            let took = crate::output::human(cluster.started_in);
            let line = format!("Sentinel Redis: primary, replica, 3 Sentinels (private, {took})");
            crate::output::details([line]);
        }
    }
    if let Some(cluster) = &sentinels {
        setup.init.redis_url = cluster.primary.url();
    }
    let played = play::play(&setup, sentinels.as_mut());
    let outcome = played.and_then(|mut played| {
        let (mut changes, finals) = table::read_back(&mut db, &schema)?;
        let statements = table::read_statements(&mut db, &schema, &mut changes)?;
        let log = LogBack {
            changes,
            statements,
            finals,
        };
        let mut read_back = Event::new("store", What::LogReadBack(log), String::new());
        read_back.t_ms = played.started.elapsed().as_millis() as u64;
        if args.json {
            crate::output::json_line(&read_back);
        }
        played.events.push(read_back);
        let mut evidence = Evidence {
            jobs: played.jobs.clone(),
            acknowledged: played.acknowledged.clone(),
            faults_planned: played.faults_planned,
            faults_played: played.faults_played,
            moments: played.moments.clone(),
            // A TTL frees a dead holder's lock within one TTL; twice that and a second
            // leave room for the next client's retries on a busy machine.
            stuck_bound_ms: (challenge == Challenge::Crash).then_some(2 * lease_ms + 1000),
            strikes: played.strikes.clone(),
            unplayed: played.unplayed.clone(),
            lease_ms,
            fences_must_rise: challenge == Challenge::Failover,
            deliveries: played.deliveries.clone(),
            proxy_sessions: played.proxy_sessions.clone(),
            clock_margin_us: played.clock_margin_us,
            ..Evidence::default()
        };
        crate::reproduce::challenge::lay_readings(&mut evidence, &played.events);
        Ok((played, evidence))
    });
    removal.now(&outcome);
    let (played, evidence) = outcome?;
    let (report, grade) =
        crate::check::challenge::graded(&evidence, played.client_failure.is_some());
    verdict::show(&setup, &run_id, &played, &evidence, &report, grade);
    if let Some(target) = picture {
        let verdict = verdict::json(&setup, &run_id, &played, &evidence, &report, grade);
        let mut recording = crate::picture::Recording::of_run(played.events, Some(verdict), vec![]);
        // The grader's findings on the history, for the picture to draw.
        recording.report = recording.verdict.as_ref().and_then(|verdict| {
            crate::reproduce::challenge::report(&recording.events, verdict).ok()
        });
        crate::picture::draw(&[target], &recording, args.json)?;
    }
    Ok(match grade {
        Grade::Pass => Exit::Done,
        Grade::Fail => Exit::Violation,
        Grade::Undecided => Exit::Undecided,
    })
}

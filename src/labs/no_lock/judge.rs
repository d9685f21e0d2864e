//! After an approach's run: the tables read back, and the evidence handed to
//! [`crate::check::no_lock`], which decides; then the lines that say what it found.

use anyhow::Result;

use super::ApproachVerdict;
use super::play::{Faults, Play};
use super::points::{FROZEN, KILLED};
use super::verdict::round1;
use crate::check::no_lock::{self as checks, Costs, ReadBack, Strike};
use crate::connect::PgClient;
use crate::events::facts::{Observed, RoundFacts, Warning};
use crate::events::{Event, What};
use crate::invoices::{self, Approach, Tally};
use crate::labs::Stage;
use crate::output::count;
use crate::store::Outcome;

/// Jobs whose first invoice came after the first SIGCONT, on the database's clock.
const FIRST_INVOICED_AFTER: &str = "SELECT count(*) FROM (SELECT min(at) AS first FROM {invoices}
                         GROUP BY customer, period) f WHERE first > $1";

/// What the database says after an approach's run.
struct Tables {
    /// Invoices per job, and each customer's balance beside its invoices.
    per_job: Vec<(i32, i64)>,
    per_customer: Vec<(i32, i64, i64)>,
    /// Seconds from the first invoice to the last.
    span: f64,
    /// Jobs first invoiced after the first SIGCONT, when a freeze was resumed.
    waited: Option<i64>,
}

impl Play<'_> {
    /// Reads the tables back and states the verdict.
    pub(super) fn judge(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        mut faults: Faults,
        tallies: Vec<Tally>,
        mut latencies: Vec<u64>,
    ) -> Result<ApproachVerdict> {
        let read = self.read_tables(db, &faults)?;
        let tables = checks::read_back(&read.per_job, &read.per_customer);
        let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
        let costs = Costs::new(
            sum(|t| t.conflicts),
            sum(|t| t.no_ops),
            sum(|t| t.rejected),
            sum(|t| t.lock_retries),
        );
        latencies.sort_unstable();
        self.worst_order_missed(stage, &mut faults, &tables);
        let frozen: Vec<Strike> = faults.frozen.iter().map(|f| f.strike.clone()).collect();
        let killed = faults.killed.as_ref().map(|k| &k.strike);
        let freezes = checks::freezes(&frozen, &tables);
        let jobs = tables.jobs;
        let round_trips = sum(|t| t.round_trips);
        let result = ApproachVerdict {
            name: self.approach.name(),
            workers: self.workers,
            duplicates: tables.duplicates,
            lost_updates: tables.lost_updates,
            lost_jobs: tables.lost_jobs,
            safe: self.approach.safe(),
            finished_in_s: (read.span * 1000.0).round() / 1000.0,
            jobs_per_s: (read.span > 0.0).then(|| round1(jobs as f64 / read.span)),
            retries: costs.retries,
            conflicts: costs.conflicts,
            no_ops: costs.no_ops,
            rejected: costs.rejected,
            lock_retries: costs.lock_retries,
            leases_lost: sum(|t| t.leases_lost),
            round_trips_per_job: (jobs > 0).then(|| round1(round_trips as f64 / jobs as f64)),
            p50_ms: invoices::percentile(&latencies, 50.0).map(round1),
            p99_ms: invoices::percentile(&latencies, 99.0).map(round1),
            correct_under_freeze: checks::correct_under_freeze(&freezes),
            freezes,
            correct_under_kill: checks::correct_under_kill(killed, &tables),
            frozen_job: faults.watched().map(|f| f.strike.job),
            killed_job: killed.map(|k| k.job),
            waited_for_the_freeze: read.waited,
            needs: self.approach.needs(),
        };
        self.warn_of_faults_not_played(stage, &frozen, killed);
        record_tables(stage, &tables, read.per_customer.len());
        record_costs(stage, &costs, result.round_trips_per_job, read.waited);
        Ok(result)
    }

    /// fenced-write-only's lesson needs the worst order: a worker frozen on its row is met
    /// by a newer holder that read before its COMMIT and waits on the row (the lab resumes
    /// it only then), and that holder's write lands after the COMMIT — its token higher,
    /// the fence lets it through with a value computed from the stale read. Once resumed,
    /// though, the waiters race whoever takes the lock next: one that reads after the
    /// COMMIT and writes first raises the fence past every waiter's token, and they are
    /// refused. The job then comes out right by luck (a busy machine's), not because the
    /// design held: a point whose waiter was refused on its customer is untested, never ok,
    /// and the timeline says why. Unless the tables show the job wrong all the same: then a
    /// holder that read before the COMMIT (not among the waiters the lab saw) wrote first,
    /// the stale write landed, and the point was put to the test — on a busy machine it
    /// happens.
    fn worst_order_missed(&self, stage: &mut Stage, faults: &mut Faults, tables: &ReadBack) {
        if self.approach != Approach::FencedWriteOnly {
            return;
        }
        let name = self.approach.name();
        for frozen in &mut faults.frozen {
            let strike = &mut frozen.strike;
            let Some(refused) = refused_waiter(&stage.log, name, &frozen.waiters, strike) else {
                continue;
            };
            if !strike.exercised || !luck_kept_it_right(tables, strike) {
                continue;
            }
            strike.exercised = false;
            stage.record(Event::new(
                "lab",
                Warning::default(),
                format!(
                    "{refused} read before {}'s COMMIT and waited on its row, but a holder that \
                     read after the COMMIT wrote first and the fence refused {refused}'s write: \
                     the worst order did not come, {} is untested",
                    strike.worker,
                    strike.at.label()
                ),
            ));
        }
    }

    /// The tables, read back: invoices per job, balances beside invoices, the span of the
    /// run, and how many jobs waited for the first SIGCONT.
    fn read_tables(&self, db: &mut PgClient, faults: &Faults) -> Result<Tables> {
        let t = &self.tables;
        let per_job = db
            .query(&t.sql(invoices::INVOICES_PER_JOB), &[])?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let per_customer = db
            .query(&t.sql(invoices::BALANCE_VS_INVOICES), &[])?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let span: f64 = db
            .query_one(&t.sql(invoices::SPAN_OF_FIRST_INVOICES), &[])?
            .get(0);
        let waited = match faults.resumed_at {
            Some(at) => Some(
                db.query_one(&t.sql(FIRST_INVOICED_AFTER), &[&at])?
                    .get::<_, i64>(0),
            ),
            None => None,
        };
        Ok(Tables {
            per_job,
            per_customer,
            span,
            waited,
        })
    }

    /// A warning for each fault the plan asked for that found no job to land in.
    fn warn_of_faults_not_played(
        &self,
        stage: &mut Stage,
        frozen: &[Strike],
        killed: Option<&Strike>,
    ) {
        let fault = self.plan.fault;
        if fault.freezes() {
            for (who, at) in checks::missed(&FROZEN, frozen) {
                stage.record(Event::new(
                    "lab",
                    Warning {
                        ..Warning::default()
                    },
                    format!(
                        "{who} finished without reaching a job to freeze at ({}): no freeze \
                         there in this run",
                        at.label()
                    ),
                ));
            }
        }
        if fault.kills() && killed.is_none() {
            stage.record(Event::new(
                "lab",
                Warning::default(),
                format!(
                    "{KILLED} finished without reaching a job to kill it in: no kill in this run"
                ),
            ));
        }
    }
}

/// What the tables say, as the database's own observation: their counts (whether they show
/// every job exactly once is the checker's finding).
fn record_tables(stage: &mut Stage, tables: &checks::ReadBack, customers: usize) {
    let count = |n: i64| Some(n as u64);
    let ids = |ids: &[i32]| Some(ids.iter().map(|&id| id.into()).collect());
    let evidence = Observed {
        duplicates: count(tables.duplicates),
        lost_jobs: count(tables.lost_jobs),
        lost_updates: count(tables.lost_updates),
        bad_jobs: ids(&tables.bad_jobs),
        bad_customers: ids(&tables.bad_customers),
        ..Observed::default()
    };
    stage.record(Event::new(
        "pg",
        What::TablesRead(evidence),
        format!(
            "the tables say: {} jobs, {} invoiced twice or more, {} never; \
                 {} of {} balances differ from their invoices",
            tables.jobs, tables.duplicates, tables.lost_jobs, tables.lost_updates, customers
        ),
    ));
}

/// What the approach paid for its safety: retries of each kind, round trips per job, and
/// the jobs that waited for a frozen worker.
fn record_costs(
    stage: &mut Stage,
    costs: &Costs,
    round_trips_per_job: Option<f64>,
    waited: Option<i64>,
) {
    let mut cost = format!(
        "{} retries (conflicts {}, no-ops {}, refused {}, lock spins {}), {} round trips \
         per job",
        costs.retries,
        costs.conflicts,
        costs.no_ops,
        costs.rejected,
        costs.lock_retries,
        round_trips_per_job.map_or("?".into(), |r| format!("{r:.1}")),
    );
    if let Some(waited) = waited {
        cost.push_str(&format!(
            "; {} first invoiced after the first SIGCONT",
            count(waited, "job", "jobs")
        ));
    }
    stage.record(Event::new(
        "lab",
        RoundFacts {
            retries: Some(costs.retries),
            ..RoundFacts::default()
        },
        cost,
    ));
}

/// The first of `waiters` (the workers that waited on `strike`'s frozen worker when it was
/// resumed) that reports a write refused by the fence on the frozen customer, in
/// `approach`'s run.
fn refused_waiter(
    log: &[Event],
    approach: &str,
    waiters: &[String],
    strike: &Strike,
) -> Option<String> {
    log.iter()
        .find(|e| {
            e.part.approach.as_deref() == Some(approach)
                && waiters.contains(&e.worker)
                && matches!(&e.what, What::Wrote(w) if w.outcome == Outcome::Rejected
                    && w.customer == Some(strike.customer.into()))
        })
        .map(|e| e.worker.clone())
}

/// The frozen job came out right by the tables: only then can a refused waiter have made
/// it right by luck. A wrong job means a stale write landed, whoever wrote it.
fn luck_kept_it_right(tables: &ReadBack, strike: &Strike) -> bool {
    tables.job_is_right(strike.job, strike.customer)
}

#[cfg(test)]
mod worst_order_tests {
    use super::*;
    use crate::events::facts::Wrote;
    use crate::invoices::Moment;

    fn refusal(worker: &str, approach: &str, customer: i64) -> Event {
        let mut event = Event::new(
            worker,
            Wrote {
                customer: Some(customer),
                token: Some(7),
                ..Wrote::new(Outcome::Rejected)
            },
            "write with token 7 found a higher fence: nothing written",
        );
        event.part.approach = Some(approach.into());
        event
    }

    #[test]
    fn a_waiter_refused_on_the_frozen_customer_means_the_worst_order_did_not_come() {
        let strike = Strike {
            worker: "w5".into(),
            at: Moment::BeforeCommit,
            job: 89,
            customer: 9,
            exercised: true,
        };
        let waiters = vec!["w10".to_string()];
        let log = vec![
            refusal("w10", "fenced-write-only", 3),
            refusal("w7", "fenced-write-only", 9),
            refusal("w10", "redis-fenced", 9),
        ];
        // Another customer, a worker that did not wait, another approach's run: no.
        assert_eq!(
            refused_waiter(&log, "fenced-write-only", &waiters, &strike),
            None
        );
        let log = [log, vec![refusal("w10", "fenced-write-only", 9)]].concat();
        assert_eq!(
            refused_waiter(&log, "fenced-write-only", &waiters, &strike).as_deref(),
            Some("w10")
        );
    }

    #[test]
    fn a_refused_waiter_leaves_the_point_tested_when_the_tables_show_the_job_wrong() {
        let strike = Strike {
            worker: "w4".into(),
            at: Moment::MidWrite,
            job: 127,
            customer: 7,
            exercised: true,
        };
        // Job 127 invoiced once, customer 7's balance matching: right, perhaps by luck.
        let right = checks::read_back(&[(127, 1), (87, 1)], &[(7, 20, 20)]);
        assert!(luck_kept_it_right(&right, &strike));
        // Customer 7's balance short of its invoices: a stale write landed all the same.
        let lost = checks::read_back(&[(127, 1), (87, 1)], &[(7, 10, 20)]);
        assert!(!luck_kept_it_right(&lost, &strike));
        // Job 127 invoiced twice: the same.
        let twice = checks::read_back(&[(127, 2), (87, 1)], &[(7, 30, 30)]);
        assert!(!luck_kept_it_right(&twice, &strike));
    }
}

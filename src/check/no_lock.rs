//! The checkers of lab `no-lock`: pure functions from the evidence the servers gave to the
//! facts its verdict states (see [`super`] for the rules every checker follows).
//!
//! The evidence is what the tables say once the run is over — how many invoices each job
//! has, each customer's balance beside the sum of its invoices — and where the lab struck:
//! which worker it froze or killed, at which job, of which customer, at which point of the
//! job. Nothing here reads what a worker believed it did.

use serde::Serialize;

use super::exactly_once;
use crate::invoices::Moment;

/// The tables, read back: the facts every approach's verdict starts from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadBack {
    pub jobs: i64,
    /// Jobs invoiced twice or more.
    pub duplicates: i64,
    /// Jobs never invoiced.
    pub lost_jobs: i64,
    /// Customers whose balance is not the sum of their invoices: an update lost (or one
    /// counted that has no invoice).
    pub lost_updates: i64,
    /// The jobs that went wrong, and the customers, for the freeze and kill columns.
    pub bad_jobs: Vec<i32>,
    pub bad_customers: Vec<i32>,
}

/// Reads the two read-backs: `per_job` is (job, invoices), `per_customer` is (customer,
/// balance, sum of its invoices). Exactly one invoice per job is right, and a balance equal
/// to its invoices.
pub fn read_back(per_job: &[(i32, i64)], per_customer: &[(i32, i64, i64)]) -> ReadBack {
    let times: Vec<i64> = per_job.iter().map(|&(_, n)| n).collect();
    let processed = exactly_once(&times);
    let wrong_balance = |&&(_, balance, invoiced): &&(i32, i64, i64)| balance != invoiced;
    ReadBack {
        jobs: processed.jobs,
        duplicates: processed.duplicates,
        lost_jobs: processed.lost,
        lost_updates: per_customer.iter().filter(wrong_balance).count() as i64,
        bad_jobs: per_job
            .iter()
            .filter(|&&(_, n)| n != 1)
            .map(|&(job, _)| job)
            .collect(),
        bad_customers: per_customer
            .iter()
            .filter(wrong_balance)
            .map(|&(customer, _, _)| customer)
            .collect(),
    }
}

impl ReadBack {
    /// Did this job come out right: invoiced once, and its customer's balance matching?
    pub fn job_is_right(&self, job: i32, customer: i32) -> bool {
        !self.bad_jobs.contains(&job) && !self.bad_customers.contains(&customer)
    }

    /// Every job invoiced once, every balance the sum of its invoices.
    pub fn correct(&self) -> bool {
        self.duplicates == 0 && self.lost_jobs == 0 && self.lost_updates == 0
    }
}

/// Where the lab struck a worker: its job, that job's customer, the point of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strike {
    pub worker: String,
    pub at: Moment,
    pub job: i32,
    pub customer: i32,
    /// A freeze: before its SIGCONT, Postgres showed another worker waiting on the frozen
    /// worker's locks, or the frozen job invoiced by another worker (or, partitioned, nobody
    /// else may touch its customers). Without that, a right result proves nothing: the
    /// freeze was not put to the test.
    pub exercised: bool,
}

/// One freeze, judged from the tables.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct PointVerdict {
    /// Where in the job the worker was frozen: before-read, decided, mid-write, before-commit.
    pub at: Moment,
    pub worker: String,
    pub job: i32,
    pub customer: i32,
    /// Its job invoiced once and its customer's balance right.
    pub correct: bool,
    /// Another worker met the frozen one before its SIGCONT ([`Strike::exercised`]).
    pub exercised: bool,
}

impl PointVerdict {
    /// The cell: failed whenever the tables say so; right only if the point was exercised;
    /// None (not exercised) for a right result that no other worker put to the test.
    pub fn finding(&self) -> Option<bool> {
        match (self.correct, self.exercised) {
            (false, _) => Some(false),
            (true, true) => Some(true),
            (true, false) => None,
        }
    }
}

/// Each freeze's verdict, in the order of a job (whatever order the freezes landed in): the
/// frozen worker's job came out right by the tables.
pub fn freezes(frozen: &[Strike], tables: &ReadBack) -> Vec<PointVerdict> {
    let mut points: Vec<PointVerdict> = frozen
        .iter()
        .map(|strike| PointVerdict {
            at: strike.at,
            worker: strike.worker.clone(),
            job: strike.job,
            customer: strike.customer,
            correct: tables.job_is_right(strike.job, strike.customer),
            exercised: strike.exercised,
        })
        .collect();
    points.sort_by_key(|p| Moment::ALL.iter().position(|m| *m == p.at));
    points
}

/// False when any frozen worker's job came out wrong; true when every one came out right
/// and every point was exercised; None when nobody was frozen or a point that came out right
/// was not exercised.
pub fn correct_under_freeze(points: &[PointVerdict]) -> Option<bool> {
    if points.iter().any(|p| !p.correct) {
        return Some(false);
    }
    (!points.is_empty() && points.iter().all(|p| p.exercised)).then_some(true)
}

/// The killed worker's job came out right — its half-written transaction left nothing, and
/// another worker did the job — and no job at all was lost; None when nobody was killed.
pub fn correct_under_kill(killed: Option<&Strike>, tables: &ReadBack) -> Option<bool> {
    killed.map(|k| tables.job_is_right(k.job, k.customer) && tables.lost_jobs == 0)
}

/// The planned freezes that did not happen (a worker that finished the list before it
/// reached a job to stop in): the verdict must say that point was not played.
pub fn missed<'a>(planned: &[(&'a str, Moment)], frozen: &[Strike]) -> Vec<(&'a str, Moment)> {
    planned
        .iter()
        .filter(|(who, _)| !frozen.iter().any(|f| f.worker == *who))
        .copied()
        .collect()
}

/// A frozen worker's Redis lock, as Redis answers while it sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockSeen {
    /// The key still holds the sleeper's owner value: its lease has not run out.
    Held,
    /// No key: Redis ended the lease; for Redis the lock is free.
    Expired,
    /// Another owner value: Redis ended the lease and granted the lock to another worker
    /// while the sleeper still believes it holds it.
    Taken,
}

/// Reads Redis's answer (the owner value in the lock's key now, if any) against the owner
/// value the frozen worker was granted.
pub fn lock_seen(now: Option<&str>, sleeper: &str) -> LockSeen {
    match now {
        Some(owner) if owner == sleeper => LockSeen::Held,
        Some(_) => LockSeen::Taken,
        None => LockSeen::Expired,
    }
}

/// What an approach's run cost, from the workers' own counts of what their attempts did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Costs {
    /// Attempts that did nothing: the sum of the four below.
    pub retries: u64,
    pub conflicts: u64,
    pub no_ops: u64,
    pub rejected: u64,
    /// Redis lock attempts that found the lock taken (waiting, not wasted writes).
    pub lock_retries: u64,
}

impl Costs {
    pub fn new(conflicts: u64, no_ops: u64, rejected: u64, lock_retries: u64) -> Costs {
        Costs {
            retries: conflicts + no_ops + rejected + lock_retries,
            conflicts,
            no_ops,
            rejected,
            lock_retries,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strike(worker: &str, at: Moment, job: i32, customer: i32) -> Strike {
        Strike {
            worker: worker.into(),
            at,
            job,
            customer,
            exercised: true,
        }
    }

    #[test]
    fn a_duplicate_a_lost_job_and_a_stale_balance_are_each_counted() {
        // Job 1 invoiced twice, job 3 never; customer 1's balance overwritten with a stale value.
        let per_job = [(0, 1), (1, 2), (2, 1), (3, 0)];
        let per_customer = [(0, 300, 300), (1, 150, 450)];
        let tables = read_back(&per_job, &per_customer);
        assert_eq!(
            (tables.duplicates, tables.lost_jobs, tables.lost_updates),
            (1, 1, 1)
        );
        assert_eq!(tables.bad_jobs, [1, 3]);
        assert_eq!(tables.bad_customers, [1]);
        assert!(!tables.correct());
        assert!(!tables.job_is_right(1, 0), "invoiced twice");
        assert!(!tables.job_is_right(3, 0), "never invoiced");
        assert!(
            !tables.job_is_right(2, 1),
            "its customer's balance is wrong"
        );
        assert!(tables.job_is_right(0, 0));
    }

    #[test]
    fn every_job_once_and_every_balance_matching_is_correct() {
        let tables = read_back(&[(0, 1), (1, 1)], &[(0, 10, 10), (1, 0, 0)]);
        assert!(tables.correct());
        assert_eq!(tables.jobs, 2);
        assert!(read_back(&[], &[]).correct(), "no jobs, nothing wrong");
    }

    #[test]
    fn a_balance_counting_an_invoice_that_does_not_exist_is_wrong_too() {
        // A killed transaction that somehow left its balance update but not its invoice.
        let tables = read_back(&[(0, 1)], &[(0, 200, 100)]);
        assert_eq!(tables.lost_updates, 1);
        assert!(!tables.job_is_right(0, 0));
    }

    #[test]
    fn a_point_is_wrong_exactly_when_the_tables_name_its_job_or_its_customer() {
        let tables = read_back(
            &[(10, 2), (11, 1), (12, 1), (13, 0)],
            &[(0, 100, 100), (1, 50, 100), (2, 100, 100), (3, 0, 0)],
        );
        let frozen = [
            strike("w1", Moment::Decided, 10, 0),
            strike("w3", Moment::BeforeRead, 11, 2),
            strike("w4", Moment::MidWrite, 12, 1),
            strike("w5", Moment::BeforeCommit, 13, 3),
        ];
        let points = freezes(&frozen, &tables);
        let verdicts: Vec<(Moment, &str, bool)> = points
            .iter()
            .map(|p| (p.at, p.worker.as_str(), p.correct))
            .collect();
        assert_eq!(
            verdicts,
            [
                (Moment::BeforeRead, "w3", true),
                (Moment::Decided, "w1", false),
                (Moment::MidWrite, "w4", false),
                (Moment::BeforeCommit, "w5", false),
            ],
            "in the order of a job; wrong by a duplicate, a balance, a lost job"
        );
        for point in &points {
            let named = tables.bad_jobs.contains(&point.job)
                || tables.bad_customers.contains(&point.customer);
            assert_eq!(named, !point.correct, "{point:?}");
        }
        assert_eq!(correct_under_freeze(&points), Some(false));
    }

    #[test]
    fn a_right_result_nobody_put_to_the_test_is_not_an_ok() {
        let tables = read_back(&[(0, 1), (1, 2)], &[(0, 1, 1), (1, 2, 2)]);
        let mut untested = strike("w5", Moment::BeforeCommit, 0, 0);
        untested.exercised = false;
        let points = freezes(&[strike("w3", Moment::BeforeRead, 0, 0), untested], &tables);
        let findings: Vec<Option<bool>> = points.iter().map(PointVerdict::finding).collect();
        assert_eq!(findings, [Some(true), None]);
        assert_eq!(correct_under_freeze(&points), None, "not all exercised");
        // A failure is a failure, exercised or not: the tables say so.
        let mut failed = strike("w5", Moment::BeforeCommit, 1, 1);
        failed.exercised = false;
        let points = freezes(&[strike("w3", Moment::BeforeRead, 0, 0), failed], &tables);
        assert_eq!(points[1].finding(), Some(false));
        assert_eq!(correct_under_freeze(&points), Some(false));
    }

    #[test]
    fn no_freeze_is_no_verdict_and_all_right_is_right() {
        let tables = read_back(&[(0, 1), (1, 1)], &[(0, 1, 1), (1, 1, 1)]);
        assert_eq!(correct_under_freeze(&freezes(&[], &tables)), None);
        let frozen = [strike("w1", Moment::Decided, 0, 0)];
        assert_eq!(correct_under_freeze(&freezes(&frozen, &tables)), Some(true));
    }

    #[test]
    fn a_kill_is_right_only_if_its_job_is_and_no_job_was_lost() {
        let killed = strike("w2", Moment::MidWrite, 5, 1);
        let right = read_back(&[(5, 1), (6, 1)], &[(1, 10, 10), (2, 10, 10)]);
        assert_eq!(correct_under_kill(Some(&killed), &right), Some(true));
        // Its own job is right, but another job was lost (a partition nobody took over).
        let lost_elsewhere = read_back(&[(5, 1), (6, 0)], &[(1, 10, 10), (2, 0, 0)]);
        assert_eq!(
            correct_under_kill(Some(&killed), &lost_elsewhere),
            Some(false)
        );
        let its_job_lost = read_back(&[(5, 0), (6, 1)], &[(1, 0, 0), (2, 10, 10)]);
        assert_eq!(
            correct_under_kill(Some(&killed), &its_job_lost),
            Some(false)
        );
        assert_eq!(correct_under_kill(None, &lost_elsewhere), None);
    }

    #[test]
    fn a_planned_freeze_that_never_landed_is_named() {
        let planned = [("w3", Moment::BeforeRead), ("w1", Moment::Decided)];
        let frozen = [strike("w1", Moment::Decided, 0, 0)];
        assert_eq!(missed(&planned, &frozen), [("w3", Moment::BeforeRead)]);
        assert!(missed(&planned[1..], &frozen).is_empty());
    }

    #[test]
    fn redis_answers_held_expired_or_taken() {
        assert_eq!(lock_seen(Some("a1"), "a1"), LockSeen::Held);
        assert_eq!(lock_seen(None, "a1"), LockSeen::Expired);
        assert_eq!(lock_seen(Some("b7"), "a1"), LockSeen::Taken);
    }

    #[test]
    fn retries_are_every_attempt_that_did_nothing_lock_spins_included() {
        let costs = Costs::new(3, 2, 1, 10);
        assert_eq!(costs.retries, 16);
        assert_eq!(Costs::new(0, 0, 0, 0).retries, 0);
    }
}

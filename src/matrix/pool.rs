//! The matrix's cells played side by side: one pool of lanes for every cell's schedules,
//! not one cell after another.
//!
//! Played cell by cell, each cell waited for its slowest schedule before the next began,
//! and a cell whose schedules need the etcd cluster (`leader-kill`) or the Sentinels'
//! primary (`failover`) played them one at a time on it while every other lane stood idle.
//! Here each lane takes the next schedule of any cell: the schedules that need a cluster
//! take their turn on it (one lane at a time per cluster, the others playing the rest), and
//! those cells start first, since one after another on their cluster they are the longest
//! chain. Each cell still plays the same schedules (its `index`-th drawn from the same seed)
//! and stops drawing at its first violation, as it did alone.
//!
//! ```text
//!  lane 0  failover#0 ─ failover#1 ─ failover#2 …        (the Sentinels', one at a time)
//!  lane 1  leader-kill#0 ─ leader-kill#1 …              (the etcd cluster's)
//!  lane 2  pause#0 ─ kill#3 ─ delay#1 ─ …               (any cell's next schedule)
//! ```

use std::sync::mpsc;
use std::sync::{Condvar, Mutex};

use anyhow::Result;

use crate::chaos::Setup;
use crate::chaos::cluster::EtcdRing;
use crate::chaos::failover::SentinelRing;
use crate::chaos::side_by_side::{Job, Played};
use crate::check::chaos::Judgement;
use crate::nemesis::generate::{self, Space};

/// A cell to play: its design's setup (its own run id) and the faults it may draw.
pub(super) struct ToPlay {
    pub setup: Setup,
    pub space: Space,
}

/// The cluster a schedule plays on alone, if any.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cluster {
    Etcd,
    Sentinels,
}

fn cluster_of(setup: &Setup, job: &Job) -> Option<Cluster> {
    if setup.etcd_ring.is_some() && EtcdRing::wanted_by(&job.schedule) {
        Some(Cluster::Etcd)
    } else if setup.sentinel_ring.is_some() && SentinelRing::wanted_by(&job.schedule) {
        Some(Cluster::Sentinels)
    } else {
        None
    }
}

/// What the lanes share: which schedule of each cell comes next, which are in flight, which
/// cluster is taken.
struct Board {
    next: Vec<u64>,
    in_flight: Vec<usize>,
    /// A violation was found: the cell draws no more.
    stopped: Vec<bool>,
    played: Vec<Vec<Played>>,
    handed_back: Vec<bool>,
    clusters_taken: Vec<Cluster>,
    failed: bool,
}

/// The schedules a cell plays, and how: shared by every lane.
pub(super) struct Plan<'a> {
    pub cells: &'a [Option<ToPlay>],
    pub seed: u64,
    pub schedules: u32,
    pub clients: u32,
    pub parallel: u32,
}

impl Plan<'_> {
    /// The `index`-th schedule of cell `cell`, as the cell alone would draw it.
    fn job(&self, cell: &ToPlay, index: u64) -> Job {
        let seed = generate::nth_seed(self.seed, index);
        Job {
            index,
            seed,
            schedule: generate::draw(seed, &cell.space),
            clients: self.clients,
        }
    }

    /// The cells in the order lanes take them: those that need a cluster first.
    fn priority(&self) -> Vec<usize> {
        let on_cluster = |cell: &ToPlay| {
            let first = self.job(cell, 0);
            cluster_of(&cell.setup, &first).is_some()
        };
        let playing = (0..self.cells.len()).filter(|&c| self.cells[c].is_some());
        let (first, rest): (Vec<usize>, Vec<usize>) =
            playing.partition(|&c| self.cells[c].as_ref().is_some_and(on_cluster));
        first.into_iter().chain(rest).collect()
    }

    /// Plays every cell's schedules, `parallel` lanes at a time; `done` sees each cell's
    /// played schedules (in the order drawn) as soon as the cell is over, in any order.
    pub fn play(&self, mut done: impl FnMut(usize, Vec<Played>) -> Result<()>) -> Result<()> {
        let order = self.priority();
        let cells = self.cells.len();
        let board = Mutex::new(Board {
            next: vec![0; cells],
            in_flight: vec![0; cells],
            stopped: vec![false; cells],
            played: (0..cells).map(|_| Vec::new()).collect(),
            handed_back: vec![false; cells],
            clusters_taken: Vec::new(),
            failed: false,
        });
        let turn = Condvar::new();
        let (tx, rx) = mpsc::channel::<Result<(usize, Vec<Played>)>>();
        let mut outcome = Ok(());
        std::thread::scope(|scope| {
            for lane in 0..self.parallel.max(1) as usize {
                let (tx, board, turn, order) = (tx.clone(), &board, &turn, &order);
                scope.spawn(move || self.lane(lane, order, board, turn, tx));
            }
            drop(tx);
            for cell in rx {
                let handed = cell.and_then(|(c, played)| done(c, played));
                if let Err(err) = handed {
                    board.lock().unwrap_or_else(|e| e.into_inner()).failed = true;
                    turn.notify_all();
                    if outcome.is_ok() {
                        outcome = Err(err);
                    }
                }
            }
        });
        outcome
    }

    /// One lane: takes the next schedule it may play, plays it, hands a finished cell on.
    fn lane(
        &self,
        lane: usize,
        order: &[usize],
        board: &Mutex<Board>,
        turn: &Condvar,
        tx: mpsc::Sender<Result<(usize, Vec<Played>)>>,
    ) {
        let mut held = board.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if held.failed || crate::procs::interrupted() {
                return;
            }
            let mut waiting = false;
            let mut taken = None;
            for &c in order {
                let Some(cell) = &self.cells[c] else { continue };
                if held.stopped[c] || held.next[c] >= u64::from(self.schedules) {
                    continue;
                }
                let job = self.job(cell, held.next[c]);
                let cluster = cluster_of(&cell.setup, &job);
                if cluster.is_some_and(|k| held.clusters_taken.contains(&k)) {
                    waiting = true;
                    continue;
                }
                held.next[c] += 1;
                held.in_flight[c] += 1;
                held.clusters_taken.extend(cluster);
                taken = Some((c, job, cluster));
                break;
            }
            let Some((c, job, cluster)) = taken else {
                let in_flight = held.in_flight.iter().any(|&n| n > 0);
                if !waiting && !in_flight {
                    turn.notify_all();
                    return;
                }
                held = turn.wait(held).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            drop(held);
            let setup = &self.cells[c].as_ref().expect("a cell to play").setup;
            let played = setup
                .play(&job.schedule, job.clients, job.index, job.seed, lane)
                .map(|trial| Played {
                    job,
                    trial,
                    done: std::time::Instant::now(),
                });
            held = board.lock().unwrap_or_else(|e| e.into_inner());
            held.in_flight[c] -= 1;
            held.clusters_taken.retain(|k| Some(*k) != cluster);
            match played {
                Ok(played) => {
                    if played.trial.report.judgement() == Judgement::Unsafe {
                        held.stopped[c] = true;
                    }
                    held.played[c].push(played);
                }
                Err(err) => {
                    held.failed = true;
                    let _ = tx.send(Err(err));
                }
            }
            let over = held.stopped[c] || held.next[c] >= u64::from(self.schedules);
            if over && held.in_flight[c] == 0 && !held.handed_back[c] {
                held.handed_back[c] = true;
                let mut played = std::mem::take(&mut held.played[c]);
                played.sort_by_key(|p| p.job.index);
                let _ = tx.send(Ok((c, played)));
            }
            turn.notify_all();
        }
    }
}

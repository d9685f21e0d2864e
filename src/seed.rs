//! `--seed`: every random choice a lab makes comes from one number, printed at the start,
//! so that a run can be played again with the same choices (`--seed N`).
//!
//! The choices are the owner values of the locks, the arrival spreads of racing workers and
//! the retry delays of Redlock. Each worker process draws from a stream of its own, derived
//! from the seed and its place among the run's workers, so that what one worker draws does
//! not shift another's, and no two processes ever draw the same owner value.
//! What the seed cannot replay is timing: which worker the scheduler runs first, how long a
//! server takes to answer. Secrets (a room's passwords) and run ids never come from it: a
//! replayed run must not share its keys with the run it replays.

use std::sync::Mutex;

/// The environment variable that hands a worker its stream: `<seed>/<n>:<worker name>`,
/// `n` counting the run's workers (names repeat from one part of a lab to the next).
pub const WORKER_SEED: &str = "LOCKSLAB_SEED";

/// SplitMix64: tiny, fast, and every seed gives a good stream. Not for secrets.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

static STREAM: Mutex<Option<(u64, SplitMix)>> = Mutex::new(None);

/// Starts this process's stream: the seed, mixed with the stream's name.
pub fn start(seed: u64, stream: &str) {
    let mixed = stream
        .bytes()
        .fold(seed, |acc, byte| SplitMix(acc ^ u64::from(byte)).next());
    *STREAM.lock().unwrap_or_else(|p| p.into_inner()) = Some((seed, SplitMix(mixed)));
}

/// The seed of this run, once started.
pub fn seed() -> Option<u64> {
    STREAM
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|(seed, _)| *seed)
}

/// A seed for a run that was given none: from the OS's random source.
pub fn fresh() -> u64 {
    // Short enough to read out and type again.
    fresh_unguessable() % 1_000_000
}

/// A seed from the whole range, for a run whose draws the program under test must not
/// guess: the challenge's seed deals which client meets which fault, and a client that
/// could learn the seed — by trying each short seed until one draws the jobs it was sent —
/// could be careful only where the faults will come. One of 2^53 (a number every JSON
/// reader keeps exactly), too many to try; longer to type, and printed all the same.
pub fn fresh_unguessable() -> u64 {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes) % (1 << 53)
}

/// `chars` hex digits from the OS's random source, never from the seed: for run ids and
/// passwords, which a replayed run must not share.
pub fn os_hex(chars: usize) -> String {
    let mut bytes = vec![0u8; chars.div_ceil(2)];
    if getrandom::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id()) << 32;
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = SplitMix(nanos.wrapping_add(i as u64)).next() as u8;
        }
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex[..chars].to_string()
}

/// Fills `bytes` from this process's stream when a seed was started, else from the OS.
pub fn fill(bytes: &mut [u8]) -> Result<(), getrandom::Error> {
    let mut stream = STREAM.lock().unwrap_or_else(|p| p.into_inner());
    match stream.as_mut() {
        Some((_, mix)) => {
            for chunk in bytes.chunks_mut(8) {
                let word = mix.next().to_le_bytes();
                chunk.copy_from_slice(&word[..chunk.len()]);
            }
            Ok(())
        }
        None => getrandom::fill(bytes),
    }
}

/// In a worker: starts the stream the orchestrator handed over, if any.
pub fn start_from_environment() {
    if let Ok(value) = std::env::var(WORKER_SEED)
        && let Some((seed, name)) = value.split_once('/')
        && let Ok(seed) = seed.parse()
    {
        start(seed, name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_stream_and_names_apart() {
        let draw = |seed, name| {
            start(seed, name);
            let mut bytes = [0u8; 12];
            fill(&mut bytes).unwrap();
            bytes
        };
        assert_eq!(draw(42, "A"), draw(42, "A"));
        assert_ne!(draw(42, "A"), draw(42, "B"));
        assert_ne!(draw(42, "A"), draw(43, "A"));
        *STREAM.lock().unwrap() = None;
    }
}

//! Is the lock service still answering? A lab whose workers wait on a lock can wait out a
//! whole lock call in silence when the server under it freezes: a frozen process keeps its
//! sockets open, so nothing fails, it just never answers. [`Liveness`] asks each server once a
//! second, on threads of its own, and says which one stopped answering.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use crate::connect::{self, Backend};

/// A watch over the servers a lab's locks live on.
pub struct Liveness {
    silent: Arc<Mutex<Option<String>>>,
    stop: Arc<AtomicBool>,
}

impl Liveness {
    /// Starts asking each server, once a second, for an answer within `within`.
    pub fn watch(servers: &[(Backend, String)], within: Duration) -> Liveness {
        let silent = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        for (backend, url) in servers {
            let (backend, url) = (*backend, url.clone());
            let (silent, stop) = (Arc::clone(&silent), Arc::clone(&stop));
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if let Some(line) = unanswered(backend, &url, within) {
                        if let Ok(mut first) = silent.lock() {
                            first.get_or_insert(line);
                        }
                        return;
                    }
                    thread::sleep(Duration::from_secs(1));
                }
            });
        }
        Liveness { silent, stop }
    }

    /// The line naming the first server that did not answer, once one has not.
    pub fn silent(&self) -> Option<String> {
        self.silent.lock().ok()?.clone()
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        // A probe stuck on a frozen server ends with the process, or when the server thaws.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Asks once. None when the server answered in time; otherwise the line that says so.
fn unanswered(backend: Backend, url: &str, within: Duration) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    let asked = url.to_string();
    thread::spawn(move || {
        let _ = tx.send(connect::probe(backend, &asked));
    });
    match rx.recv_timeout(within) {
        Ok(Ok(())) => None,
        // A client's own timeout is the same silence, in its library's words.
        Ok(Err(err)) if silence(&format!("{err:#}")) => Some(backend.frozen(url, within)),
        Ok(Err(err)) => Some(format!("{err:#}")),
        Err(_) => Some(backend.frozen(url, within)),
    }
}

fn silence(line: &str) -> bool {
    connect::names_a_silent_server(line) || line.contains("imeout") || line.contains("timed out")
}

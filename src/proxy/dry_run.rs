//! Trying a held write before the fault lands on it: in the client's own session, inside a
//! transaction that is rolled back, the proxy runs the write it caught and asks the server
//! how many rows of the watched table it updated — read from a log the server's own trigger
//! keeps, per session ([`Probe`]), not from what the client's bytes claim. So the challenge can tell a write that would have
//! changed the records from one that matches nothing whenever it runs (`… AND false`): a
//! client that sends such writes first, to take the fault there and check its lock just
//! before its real write, no longer draws the fault away from the write that counts, and a
//! write the database refused after the fault is a refusal only if, tried when it was
//! caught, it would have changed the records.
//!
//! ```text
//!  client ─ UPDATE … ─▶ proxy   (idle: every earlier request answered)
//!                        ├─▶ BEGIN; SET LOCAL statement_timeout …; mark the log's end
//!                        ├─▶ the client's own bytes, as they came
//!                        ├─▶ rows this session changed since the mark
//!                        └─▶ ROLLBACK          (in a transaction of the client's: a savepoint)
//!  server answers ────▶ read and kept from the client, to the last ReadyForQuery
//!  then the write goes on as before: to the gate, to its fault, or straight through
//! ```
//!
//! The try runs in the client's session because the write may lean on it: its search path,
//! its temporary tables, its prepared statements. It is made only when it cannot leave a
//! trace — one whole request of plain reads and writes ([`super::pg::why_not_try`]), the
//! session idle and not in a failed transaction — and every other case is "not tried", which
//! the challenge treats as knowing nothing: a refusal it cannot weigh proves nothing.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, oneshot};

/// What trying the held write showed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tried {
    /// Run when it was caught, it updated rows of the watched table.
    Changes,
    /// Run when it was caught, it matched no row of the watched table, or changed none.
    ChangesNothing,
    /// Run when it was caught, it changed rows of the watched table, but no value, items or
    /// job in them: a claim (a new `fence`), not a write of a job's effect. A fault aimed at
    /// the write lets it by; the worst order holds a newer holder at it.
    Claims,
    /// Run when it was caught, the server refused it for a conflict it found — a
    /// serialization failure or a deadlock ([`conflict_found_by_the_server`]), its words
    /// here: at REPEATABLE READ or SERIALIZABLE, most often, the row it updates was changed
    /// by a transaction committed after its snapshot. It is a write of the record, refused.
    Refused(String),
    /// It was not tried, or the try told nothing: why.
    Untried(String),
}

impl Tried {
    /// Tried when it was caught, it was a write of the records: it changed rows, or the
    /// server refused it because its read was stale. Either way it is no write that matches
    /// nothing whenever it runs, so a refusal of it after the fault is the fault biting.
    pub fn writes(&self) -> bool {
        matches!(self, Tried::Changes | Tried::Claims | Tried::Refused(_))
    }
}

/// How long the try may take in all before the connection is given up, and the limits it
/// sets on itself inside the server.
const TRY_PATIENCE: Duration = Duration::from_secs(5);
const STATEMENT_TIMEOUT_MS: u32 = 1500;
pub const LOCK_TIMEOUT_MS: u32 = 500;
/// How long the write waits for the client's earlier requests to be answered first.
const IDLE_PATIENCE: Duration = Duration::from_secs(1);

/// One connection's conversation with the server, as the proxy follows it: requests
/// answered, the transaction status, and the try listening to the answers meanwhile.
pub(super) struct Conversation {
    talk: Mutex<Talk>,
    answered: Notify,
}

impl Default for Conversation {
    fn default() -> Conversation {
        let talk = Talk {
            at_boundary: true,
            ..Talk::default()
        };
        Conversation {
            talk: Mutex::new(talk),
            answered: Notify::new(),
        }
    }
}

#[derive(Default)]
struct Talk {
    /// `ReadyForQuery` messages the server sent, and the status of the last.
    answered: u64,
    status: u8,
    /// The server's bytes are read up to a message's end (the try may begin there).
    at_boundary: bool,
    framer: Framer,
    listening: Option<Listening>,
    /// The server's process for this connection, from its `BackendKeyData`: the session
    /// whose statements and changes the server's logs name (`pg_backend_pid()`).
    backend_pid: Option<i32>,
    /// A serialization failure or deadlock the server found in the open transaction
    /// ([`conflict_found_by_the_server`]), and the request it answered (counted as
    /// `answered` counts them), until the transaction ends: aborted, or saved by a rollback
    /// to a savepoint.
    conflict: Option<(String, u64)>,
    /// An `UPDATE` completed in the answer to the request being answered now: a conflict
    /// found after it in the same request is a later statement's, not the first one's.
    updated_in_request: bool,
    /// Transactions the server ended for such a conflict, not yet taken
    /// ([`Conversation::aborted`]).
    aborted: Vec<(String, u64)>,
    /// A write of the watched table in the open transaction completed with a tag that does
    /// not say it changed no row (`UPDATE 1`, or a `WITH … SELECT`'s `SELECT n`): its commit
    /// may commit a change of the records. A change of another table (the client's own)
    /// does not count: the commit that matters is the records'. (A `ROLLBACK TO SAVEPOINT`
    /// that undid the change leaves it set: the commit is held, and, with no change of its
    /// job in the log, graded as missed.)
    changed_in_transaction: bool,
    /// The requests that send a write of the watched table ([`Conversation::writes_in`]).
    write_requests: std::collections::BTreeSet<u64>,
    /// The request being answered now completed a statement whose tag does not say it changed
    /// no row.
    completed_unknown: bool,
}

/// How the try asks the server what the write did: a function that marks the end of the
/// server's log of statements under a nonce, and one that gives, for that nonce, the rows
/// this session's statements changed in the watched table since (both run as the client's
/// role).
#[derive(Clone, Debug)]
pub struct Probe {
    pub begins: String,
    /// Counts the rows whose value, items or job the try changed: a job's effect.
    pub changed: String,
    /// Counts the rows the try changed in any column: a claim's new fence too.
    pub touched: String,
}

/// The try in flight: which of its four answers the server is on, what it read so far.
struct Listening {
    part: usize,
    /// The two counts the try asked for, as sent: rows whose effect changed, rows changed.
    rows: Vec<Vec<u8>>,
    trouble: Option<String>,
    /// The write itself was refused for a conflict the server found.
    refused: Option<String>,
    /// An `UPDATE` of the write's request completed before any error.
    updated: bool,
    status_before: u8,
    done: Option<oneshot::Sender<Tried>>,
}

/// Whether a `CommandComplete` tag says its statement changed no row: `UPDATE 0`,
/// `DELETE 0`, `MERGE 0`, `INSERT 0 0` (or a transaction's control: `BEGIN`, `SAVEPOINT`).
fn changes_none(tag: &[u8]) -> bool {
    let tag = tag.strip_suffix(b"\0").unwrap_or(tag);
    let text = String::from_utf8_lossy(tag);
    let mut words = text.split(' ');
    let verb = words.next().unwrap_or_default();
    let zero = words.next_back() == Some("0");
    matches!(verb, "BEGIN" | "START" | "SAVEPOINT" | "SET")
        || (matches!(verb, "UPDATE" | "DELETE" | "MERGE" | "INSERT") && zero)
}

/// The answers of the try, each ending at a `ReadyForQuery`: the opening with the mark, the
/// held write, the rows counted, the rollback.
const PARTS: usize = 4;

impl Conversation {
    /// Reads bytes the server sent; returns where in them the bytes for the client begin
    /// (`chunk.len()`: none are, all were the try's).
    pub(super) fn heard(&self, chunk: &[u8]) -> usize {
        let mut talk = self.lock();
        let talk = &mut *talk;
        let mut forward_from = if talk.listening.is_some() {
            chunk.len()
        } else {
            0
        };
        let mut woke = false;
        let mut messages = Vec::new();
        talk.framer.feed(chunk, |kind, body, end| {
            messages.push((kind, body.to_vec(), end))
        });
        for (kind, body, end) in messages {
            if kind == b'K'
                && let Some(pid) = body.get(..4)
            {
                talk.backend_pid = Some(i32::from_be_bytes([pid[0], pid[1], pid[2], pid[3]]));
            }
            let Some(listening) = talk.listening.as_mut() else {
                if kind == b'C' && body.starts_with(b"UPDATE") {
                    talk.updated_in_request = true;
                }
                if kind == b'C' && !changes_none(&body) {
                    talk.completed_unknown = true;
                }
                if kind == b'E'
                    && let Some(why) = conflict_found_by_the_server(&body)
                {
                    // Request 0 is none: a conflict after an UPDATE of the same request is a
                    // later statement's (one of the client's own tables, say), never taken
                    // for the refusal of a write that request began with.
                    let request = if talk.updated_in_request {
                        0
                    } else {
                        talk.answered + 1
                    };
                    talk.conflict = Some((why, request));
                }
                if kind == b'Z' {
                    talk.answered += 1;
                    let request = talk.answered;
                    if talk.write_requests.remove(&request) && talk.completed_unknown {
                        talk.changed_in_transaction = true;
                    }
                    talk.completed_unknown = false;
                    talk.updated_in_request = false;
                    talk.status = body.first().copied().unwrap_or(b'I');
                    match talk.status {
                        // Back outside a transaction: the one in which the conflict was
                        // found ended, and nothing it did was kept.
                        b'I' => {
                            talk.aborted.extend(talk.conflict.take());
                            talk.changed_in_transaction = false;
                        }
                        // A rollback to a savepoint saved the transaction: it goes on.
                        b'T' => talk.conflict = None,
                        _ => {}
                    }
                    woke = true;
                }
                continue;
            };
            listening.hear(kind, &body);
            if listening.part == PARTS {
                let listening = talk.listening.take().expect("listening");
                listening.finish(talk.status_after(&body));
                // The try's last answer ends here: what follows is the client's again.
                forward_from = end;
            }
        }
        talk.at_boundary = talk.framer.at_boundary();
        if woke {
            self.answered.notify_waiters();
        }
        forward_from
    }

    /// The proxy signed in for its client ([`super::sign_in`]): the server's bytes read from
    /// now on are typed messages, past any answer to a request for encryption.
    pub(super) fn signed_in(&self) {
        self.lock().framer.typed = true;
    }

    /// The server's process for this connection, once the server named it; and whether
    /// the connection went encrypted, when no name can be read any more.
    pub(super) fn backend(&self) -> (Option<i32>, bool) {
        let talk = self.lock();
        (talk.backend_pid, talk.framer.opaque)
    }

    /// The transactions the server aborted for a serialization failure or a deadlock since
    /// last asked, each as the server worded it (see [`conflict_found_by_the_server`]), with
    /// the request whose answer said so (the connection's first, its startup, is 1).
    pub(super) fn aborted(&self) -> Vec<(String, u64)> {
        std::mem::take(&mut self.lock().aborted)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Talk> {
        self.talk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a `COMMIT` sent now, after `asked` requests, commits no change of the records:
    /// every request before it was answered, and no write of the records in the open
    /// transaction said it changed a row (or the transaction failed, so that its `COMMIT`
    /// rolls it back, or none is open). A request not answered yet may have changed rows: then
    /// it may commit something.
    pub(super) fn commit_commits_nothing(&self, asked: u64) -> bool {
        let talk = self.lock();
        let settled = talk.answered >= asked && talk.at_boundary && talk.listening.is_none();
        let nothing = match talk.status {
            // No transaction open: a `COMMIT` only warns. A failed one: it rolls back.
            b'I' | b'E' => true,
            _ => !talk.changed_in_transaction,
        };
        settled && nothing
    }

    /// Request `request` (counted as `answered` counts them) sends a write of the watched
    /// table: its answer counts as a change unless its tag says it changed no row — a
    /// write inside a `WITH … SELECT` answers with the `SELECT`'s tag, which says nothing of
    /// the rows it wrote.
    pub(super) fn writes_in(&self, request: u64) {
        self.lock().write_requests.insert(request);
    }

    /// Waits until the server has answered `asked` requests and its bytes stand at a
    /// message's end; then the status of the session (`I`, `T` or `E`), or none.
    pub(super) async fn idle(&self, asked: u64) -> Option<u8> {
        let give_up = tokio::time::Instant::now() + IDLE_PATIENCE;
        let idle = || {
            let talk = self.lock();
            (talk.answered >= asked && talk.at_boundary && talk.listening.is_none())
                .then_some(talk.status)
        };
        loop {
            // Listening before looking: an answer read in between still wakes it.
            let notified = self.answered.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(status) = idle() {
                return Some(status);
            }
            if tokio::time::timeout_at(give_up, notified).await.is_err() {
                return idle();
            }
        }
    }

    /// Starts listening for the try's answers; its result comes on the receiver.
    pub(super) fn listen(&self, status: u8) -> oneshot::Receiver<Tried> {
        let (done, result) = oneshot::channel();
        self.lock().listening = Some(Listening {
            part: 0,
            rows: Vec::new(),
            trouble: None,
            refused: None,
            updated: false,
            status_before: status,
            done: Some(done),
        });
        result
    }
}

impl Talk {
    fn status_after(&mut self, ready: &[u8]) -> u8 {
        self.status = ready.first().copied().unwrap_or(b'I');
        self.status
    }
}

impl Listening {
    fn hear(&mut self, kind: u8, body: &[u8]) {
        if kind == b'C' && self.part == 1 && body.starts_with(b"UPDATE") {
            self.updated = true;
        }
        match kind {
            b'D' if self.part == 2 => self.rows.push(first_column(body)),
            b'E' if self.trouble.is_none() => {
                if self.part == 1 && !self.updated {
                    self.refused = conflict_found_by_the_server(body);
                }
                let said = error_message(body);
                let part = [
                    "opening the try",
                    "the write",
                    "counting rows",
                    "the rollback",
                ];
                self.trouble = Some(format!(
                    "{} failed in the try: {said}",
                    part[self.part.min(3)]
                ));
            }
            b'Z' => self.part += 1,
            _ => {}
        }
    }

    fn finish(mut self, status_after: u8) {
        let count = |rows: &[u8]| std::str::from_utf8(rows).ok()?.parse::<i64>().ok();
        let counts = match &self.rows[..] {
            [effects, touched] => count(effects).zip(count(touched)),
            _ => None,
        };
        let tried = match (&self.trouble, counts) {
            _ if status_after != self.status_before => Tried::Untried(format!(
                "the session's status after the try ({}) is not the one before ({})",
                status_after as char, self.status_before as char
            )),
            (Some(_), _) if let Some(conflict) = self.refused.take() => Tried::Refused(conflict),
            (Some(trouble), _) => Tried::Untried(trouble.clone()),
            (None, Some((0, 0))) => Tried::ChangesNothing,
            (None, Some((0, _))) => Tried::Claims,
            (None, Some(_)) => Tried::Changes,
            (None, None) => Tried::Untried("the rows it updated were not read back".into()),
        };
        if let Some(done) = self.done.take() {
            let _ = done.send(tried);
        }
    }
}

/// The bytes the proxy sends around the held write: the opening (limits, and the log's
/// end kept in a setting local to the try), the count and the rollback, for a session idle
/// (`I`) or inside a transaction of its own (`T`). Every name is schema-qualified: the
/// client's search path is its own.
pub(super) fn around(probe: &Probe, status: u8, held: &[u8]) -> Vec<u8> {
    let Probe {
        begins,
        changed,
        touched,
    } = probe;
    // Hex only: nothing to quote.
    let nonce = crate::seed::os_hex(16);
    let limits = format!(
        "SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}; \
         SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}; \
         SELECT {begins}('{nonce}')"
    );
    // Two rows, in this order, before one ReadyForQuery.
    let count = format!("SELECT {changed}('{nonce}'); SELECT {touched}('{nonce}')");
    let (open, close) = if status == b'T' {
        (
            format!("SAVEPOINT lockslab_try; {limits}"),
            "ROLLBACK TO SAVEPOINT lockslab_try; RELEASE SAVEPOINT lockslab_try".to_string(),
        )
    } else {
        (format!("BEGIN; {limits}"), "ROLLBACK".to_string())
    };
    let mut bytes = query(&open);
    bytes.extend_from_slice(held);
    bytes.extend(query(&count));
    bytes.extend(query(&close));
    bytes
}

pub(super) const PATIENCE: Duration = TRY_PATIENCE;

fn query(sql: &str) -> Vec<u8> {
    let mut out = vec![b'Q'];
    out.extend_from_slice(&(sql.len() as u32 + 5).to_be_bytes());
    out.extend_from_slice(sql.as_bytes());
    out.push(0);
    out
}

/// A `DataRow`'s first column, as sent (empty for NULL).
fn first_column(body: &[u8]) -> Vec<u8> {
    let Some(length) = body.get(2..6) else {
        return Vec::new();
    };
    let length = i32::from_be_bytes([length[0], length[1], length[2], length[3]]);
    if length < 0 {
        return Vec::new();
    }
    body.get(6..6 + length as usize)
        .unwrap_or_default()
        .to_vec()
}

/// An `ErrorResponse`'s message field.
fn error_message(body: &[u8]) -> String {
    error_field(body, b'M').unwrap_or_else(|| "an error".into())
}

/// One field of an `ErrorResponse` (`C` its SQLSTATE, `M` its message, `F` the server's
/// source file that raised it), if it came whole.
fn error_field(body: &[u8], wanted: u8) -> Option<String> {
    let mut rest = body;
    while let Some((&code, tail)) = rest.split_first() {
        if code == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0)?;
        if code == wanted {
            return Some(String::from_utf8_lossy(&tail[..end]).into_owned());
        }
        rest = tail.get(end + 1..).unwrap_or_default();
    }
    None
}

/// A serialization failure (SQLSTATE `40001`) or a deadlock (`40P01`) that the server
/// itself found, as `"40001: <its message>"`: it fails the statement, and the transaction
/// can keep nothing past it but what a rollback to a savepoint saves. At REPEATABLE READ or
/// SERIALIZABLE it is how the database refuses an UPDATE of a row that a transaction
/// committed after the snapshot has changed (SERIALIZABLE also refuses some conflicts
/// through other rows); a deadlock can come at any level. One that PL/pgSQL raised
/// (`RAISE … USING ERRCODE`, source file `pl_exec.c`) is the client's own words, not a
/// conflict the server found; a field cut off in the proxy's copy counts as not found.
fn conflict_found_by_the_server(body: &[u8]) -> Option<String> {
    let code = error_field(body, b'C')?;
    if code != "40001" && code != "40P01" {
        return None;
    }
    let raised_in = error_field(body, b'F')?;
    if raised_in == "pl_exec.c" {
        return None;
    }
    Some(format!("{code}: {}", error_field(body, b'M')?))
}

/// Splits the server's bytes into messages, in pieces of any size; keeps the first bytes of
/// each body (what is read of it: a status, a digest, an error).
#[derive(Default)]
struct Framer {
    head: Vec<u8>,
    left: usize,
    body: Vec<u8>,
    /// Past the answers to requests for encryption, each one untyped byte (`N`: no, go on
    /// in plain text) — or encrypted (`S`, `G`), when nothing is read any more.
    typed: bool,
    opaque: bool,
}

const KEPT: usize = 4096;

impl Framer {
    /// Calls `each` with every message that ends in `chunk`: its type, its first bytes, and
    /// where in `chunk` it ends.
    fn feed(&mut self, chunk: &[u8], mut each: impl FnMut(u8, &[u8], usize)) {
        let mut at = 0;
        while at < chunk.len() && !self.opaque {
            if !self.typed && self.head.is_empty() {
                match chunk[at] {
                    b'N' => {
                        at += 1;
                        continue;
                    }
                    b'S' | b'G' => {
                        self.opaque = true;
                        return;
                    }
                    _ => self.typed = true,
                }
            }
            if self.head.len() < 5 {
                let take = (5 - self.head.len()).min(chunk.len() - at);
                self.head.extend_from_slice(&chunk[at..at + take]);
                at += take;
                if self.head.len() < 5 {
                    return;
                }
                let length =
                    u32::from_be_bytes([self.head[1], self.head[2], self.head[3], self.head[4]]);
                self.left = (length as usize).saturating_sub(4);
                self.body.clear();
            }
            let take = self.left.min(chunk.len() - at);
            let keep = take.min(KEPT.saturating_sub(self.body.len()));
            self.body.extend_from_slice(&chunk[at..at + keep]);
            self.left -= take;
            at += take;
            if self.left == 0 {
                each(self.head[0], &self.body, at);
                self.head.clear();
            }
        }
    }

    fn at_boundary(&self) -> bool {
        self.head.is_empty() && !self.opaque
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_tag_says_it_changed_nothing_only_with_a_zero_count() {
        for tag in ["UPDATE 0", "INSERT 0 0", "DELETE 0", "MERGE 0", "BEGIN"] {
            assert!(changes_none(format!("{tag}\0").as_bytes()), "{tag}");
        }
        // A write in a `WITH … SELECT` answers with the SELECT's tag: it may have changed rows.
        for tag in ["UPDATE 1", "SELECT 0", "SELECT 3", "UPDATE"] {
            assert!(!changes_none(format!("{tag}\0").as_bytes()), "{tag}");
        }
    }

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![kind];
        out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        out.extend_from_slice(body);
        out
    }

    fn row(value: &str) -> Vec<u8> {
        let mut body = 1u16.to_be_bytes().to_vec();
        body.extend_from_slice(&(value.len() as i32).to_be_bytes());
        body.extend_from_slice(value.as_bytes());
        message(b'D', &body)
    }

    fn ready(status: u8) -> Vec<u8> {
        message(b'Z', &[status])
    }

    /// The server's answers to a try whose write the log counts as `rows` rows: `effects`
    /// of them with a value, items or job changed.
    fn answers(effects: &str, rows: &str, write: Vec<u8>) -> Vec<u8> {
        let mut out = message(b'C', b"BEGIN\0");
        out.extend(row("17"));
        out.extend(ready(b'T'));
        out.extend(write);
        out.extend(ready(b'T'));
        out.extend(row(effects));
        out.extend(row(rows));
        out.extend(ready(b'T'));
        out.extend(message(b'C', b"ROLLBACK\0"));
        out.extend(ready(b'I'));
        out
    }

    fn tried_in_pieces(stream: &[u8], piece: usize) -> (Tried, Vec<u8>) {
        let conversation = Conversation::default();
        conversation.lock().status = b'I';
        let mut result = conversation.listen(b'I');
        let mut forwarded = Vec::new();
        for chunk in stream.chunks(piece) {
            let from = conversation.heard(chunk);
            forwarded.extend_from_slice(&chunk[from..]);
        }
        (result.try_recv().expect("a result"), forwarded)
    }

    #[test]
    fn a_try_is_read_to_its_last_answer_in_pieces_of_any_size_and_kept_from_the_client() {
        let changed = answers("1", "1", message(b'C', b"UPDATE 1\0"));
        let unchanged = answers("0", "0", message(b'C', b"UPDATE 0\0"));
        let claim = answers("0", "1", message(b'C', b"UPDATE 1\0"));
        let failed = answers("0", "0", message(b'E', b"SERROR\0M boom\0\0"));
        for piece in [1, 3, 7, 1000] {
            let mut with_after = changed.clone();
            with_after.extend(message(b'N', b"later\0"));
            let (tried, forwarded) = tried_in_pieces(&with_after, piece);
            assert_eq!(tried, Tried::Changes);
            assert_eq!(forwarded, message(b'N', b"later\0"), "piece {piece}");
            assert_eq!(tried_in_pieces(&unchanged, piece).0, Tried::ChangesNothing);
            assert_eq!(tried_in_pieces(&claim, piece).0, Tried::Claims);
            let (failed, forwarded) = tried_in_pieces(&failed, piece);
            assert!(matches!(failed, Tried::Untried(why) if why.contains("boom")));
            assert!(forwarded.is_empty());
        }
    }

    #[test]
    fn the_answers_to_requests_for_encryption_are_single_bytes_and_an_accepted_one_ends_it() {
        let conversation = Conversation::default();
        let mut stream = b"NN".to_vec();
        stream.extend(message(b'R', &[0, 0, 0, 0]));
        stream.extend(ready(b'I'));
        for chunk in stream.chunks(3) {
            conversation.heard(chunk);
        }
        assert_eq!(conversation.lock().answered, 1);
        let encrypted = Conversation::default();
        encrypted.heard(b"S\x16\x03\x01");
        encrypted.heard(&ready(b'I'));
        let talk = encrypted.lock();
        assert_eq!((talk.answered, talk.at_boundary), (0, false));
    }

    fn error(code: &str, file: &str) -> Vec<u8> {
        let body = format!("SERROR\0C{code}\0Mcould not serialize access\0F{file}\0\0");
        message(b'E', body.as_bytes())
    }

    #[test]
    fn a_transaction_the_server_ended_for_a_conflict_is_told_once_it_is_over() {
        let conversation = Conversation::default();
        // Inside a transaction: failed, then rolled back.
        let mut stream = error("40001", "nodeModifyTable.c");
        stream.extend(ready(b'E'));
        assert_eq!(conversation.heard(&stream), 0);
        assert!(conversation.aborted().is_empty(), "not over yet");
        assert_eq!(conversation.heard(&ready(b'I')), 0);
        // The error answered the first request: nothing was answered before it.
        assert_eq!(
            conversation.aborted(),
            vec![("40001: could not serialize access".to_string(), 1)]
        );
        assert!(conversation.aborted().is_empty(), "told once");
        // A deadlock, outside a transaction: over at once.
        let mut stream = error("40P01", "deadlock.c");
        stream.extend(ready(b'I'));
        conversation.heard(&stream);
        let aborted = conversation.aborted();
        assert_eq!(aborted.len(), 1);
        assert_eq!(aborted[0].1, 3, "two requests were answered before it");
    }

    #[test]
    fn a_conflict_saved_by_a_savepoint_or_raised_by_plpgsql_or_of_another_kind_is_no_abort() {
        let conversation = Conversation::default();
        let mut stream = error("40001", "nodeModifyTable.c");
        stream.extend(ready(b'E'));
        stream.extend(ready(b'T')); // ROLLBACK TO SAVEPOINT: the transaction goes on
        stream.extend(ready(b'I'));
        stream.extend(error("40001", "pl_exec.c")); // RAISE … USING ERRCODE
        stream.extend(ready(b'I'));
        stream.extend(error("23505", "nbtinsert.c")); // a unique violation
        stream.extend(ready(b'I'));
        conversation.heard(&stream);
        assert!(conversation.aborted().is_empty());
        // `UPDATE records …; UPDATE own …` in one request: the second one's conflict is no
        // refusal of the first (request 0: none).
        let mut stream = message(b'C', b"UPDATE 1\0");
        stream.extend(error("40001", "nodeModifyTable.c"));
        stream.extend(ready(b'I'));
        conversation.heard(&stream);
        assert_eq!(conversation.aborted()[0].1, 0);
    }

    #[test]
    fn a_try_the_server_refuses_for_a_conflict_is_a_refused_write() {
        let refused = answers("0", "0", error("40001", "nodeModifyTable.c"));
        let (tried, _) = tried_in_pieces(&refused, 3);
        assert_eq!(
            tried,
            Tried::Refused("40001: could not serialize access".into())
        );
        assert!(tried.writes());
        let raised = answers("0", "0", error("40001", "pl_exec.c"));
        let (tried, _) = tried_in_pieces(&raised, 3);
        assert!(matches!(tried, Tried::Untried(_)), "{tried:?}");
    }

    #[test]
    fn answers_are_counted_and_the_status_kept_when_nothing_is_tried() {
        let conversation = Conversation::default();
        let mut stream = message(b'C', b"UPDATE 1\0");
        stream.extend(ready(b'T'));
        stream.extend(ready(b'E'));
        for chunk in stream.chunks(2) {
            assert_eq!(conversation.heard(chunk), 0);
        }
        let talk = conversation.lock();
        assert_eq!(
            (talk.answered, talk.status, talk.at_boundary),
            (2, b'E', true)
        );
    }
}

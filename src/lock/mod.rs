//! The locks, one file per backend, the broken variants beside the correct ones.
//!
//! Read [`redis`] first: it is the lock most people write, with each of its mistakes and
//! each fix next to each other.

pub mod etcd;
pub mod etcd_election;
pub mod etcd_queue;
pub mod lease_guard;
pub mod postgres;
pub mod redis;
pub mod redlock;

/// A random owner value: 16 random bytes (from `--seed` when given, else the OS), as 32
/// hex digits.
///
/// It answers "is this lock still mine?" and nothing else: it has no order, so it cannot
/// serve as a fencing token.
pub fn random_owner() -> String {
    let mut bytes = [0u8; 16];
    // The OS random source does not fail on Linux once booted; a fixed value would only
    // weaken the owner check, so fall back to the time and pid rather than abort.
    if crate::seed::fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        bytes[..8].copy_from_slice(&(nanos as u64).to_le_bytes());
        bytes[8..12].copy_from_slice(&std::process::id().to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An error and its causes in one line, each said once: a client library's error often
/// repeats its source's words (`Broken pipe (os error 32): Broken pipe (os error 32)`).
/// A gRPC transport error's debug dump (etcd's client) is said as the socket error under it.
pub fn causes(err: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in err.chain() {
        let words = cause.to_string();
        let socket = socket_error(&words);
        let words = socket.map_or(words, String::from);
        if said.contains(&words) {
            continue;
        }
        if !said.is_empty() {
            said.push_str(": ");
        }
        said.push_str(&words);
        if socket.is_some() {
            break;
        }
    }
    said
}

/// The socket error a transport error's text names, in a few words.
fn socket_error(words: &str) -> Option<&'static str> {
    const KNOWN: &[(&[&str], &str)] = &[
        (
            &["ConnectionReset", "code: 104", "os error 104"],
            "connection reset",
        ),
        (
            &["ConnectionRefused", "code: 111", "os error 111"],
            "connection refused",
        ),
        (&["BrokenPipe", "code: 32,", "os error 32"], "broken pipe"),
        // hyper's "the connection closed under a request in flight" (a cut mid-stream).
        (
            &["Canceled, \"connection closed\"", "operation was canceled"],
            "connection closed",
        ),
    ];
    let dump = words.contains("tonic::transport") || words.contains("transport error");
    KNOWN
        .iter()
        .find(|(marks, _)| dump && marks.iter().any(|m| words.contains(m)))
        .map(|&(_, short)| short)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "Broken pipe");
        let err = anyhow::Error::new(io)
            .context("Broken pipe")
            .context("renewing");
        assert_eq!(causes(&err), "renewing: Broken pipe");
    }

    #[test]
    fn a_grpc_transport_dump_is_said_as_its_socket_error() {
        let dump = "grpc request error: code: 'Unknown error', message: \"transport error\", \
                    source: tonic::transport::Error(Transport, ConnectError(\"tcp connect \
                    error\", Os { code: 104, kind: ConnectionReset, message: \"Connection \
                    reset by peer\" }))";
        let err = anyhow::anyhow!(dump).context("etcd: opening the keepalive stream");
        assert_eq!(
            causes(&err),
            "etcd: opening the keepalive stream: connection reset"
        );
        let cut = "grpc request error: code: 'The operation was cancelled', message: \
                   \"operation was canceled\", source: tonic::transport::Error(Transport, \
                   hyper::Error(Canceled, \"connection closed\"))";
        let err = anyhow::anyhow!(cut).context("etcd: opening the keepalive stream");
        assert_eq!(
            causes(&err),
            "etcd: opening the keepalive stream: connection closed"
        );
    }
}

//! The servers' own counts of what a queue cost them: read before and after, subtracted.
//!
//! - etcd serves Prometheus metrics on its client URL, at `/metrics`: the gRPC requests it
//!   handled, by method, and `etcd_debugging_mvcc_events_total`, the watch events it sent.
//! - Redis answers `INFO commandstats`: how many times each command was called — the
//!   commands a script runs included, each under its own name.
//!
//! On a server that others use at the same time their requests are counted too; the lab
//! shows the waiters' own count beside the server's.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

use crate::connect;
use crate::events::facts::ServerCount;

/// One reading of a server's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reading {
    pub requests: u64,
    pub watch_events: Option<u64>,
}

impl Reading {
    /// What the server counted between `self` (before) and `after`.
    pub fn until(self, after: Reading, source: &str) -> ServerCount {
        ServerCount {
            requests: Some(after.requests.saturating_sub(self.requests)),
            watch_events: match (self.watch_events, after.watch_events) {
                (Some(before), Some(after)) => Some(after.saturating_sub(before)),
                _ => None,
            },
            source: source.into(),
        }
    }
}

/// The KV requests etcd counts, as the recipe and the herd send them.
const ETCD_KV_METHODS: [&str; 4] = ["Range", "Put", "DeleteRange", "Txn"];

/// Where etcd's figures come from, as the verdict says it.
pub const ETCD_SOURCE: &str =
    "etcd /metrics: KV requests + watches opened, leases and watch events not counted";
pub const REDIS_SOURCE: &str = "Redis INFO commandstats: EVAL and EVALSHA calls";

/// The spinning lock sends scripts only: a try (`SET NX PX` and `INCR` for the token) and a
/// compare-and-delete release. Redis also counts each command a script runs, under its own
/// name, so those counts would add the work inside a request to the requests.
const REDIS_SCRIPT_COMMANDS: [&str; 4] = ["eval", "evalsha", "eval_ro", "evalsha_ro"];

/// etcd's counters from its `/metrics` page.
pub fn etcd(url: &str) -> Result<Reading> {
    let page = http_get(url, "/metrics").context("etcd: reading /metrics")?;
    etcd_from_metrics(&page)
}

/// Sums what a queue costs etcd out of its metrics page.
///
/// - `grpc_server_handled_total{grpc_method="Range"…}`: unary KV requests handled, by code;
/// - `grpc_server_msg_received_total{grpc_method="Watch"…}`: messages on watch streams,
///   one per watch opened;
/// - `etcd_debugging_mvcc_events_total`: events sent to watchers.
///
/// Lease grants, keepalives and log-ins are left out: every way of queueing pays them alike.
pub fn etcd_from_metrics(page: &str) -> Result<Reading> {
    let mut requests = 0u64;
    let mut events = None;
    for line in page.lines() {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let value = value as u64;
        let kv_request = name.starts_with("grpc_server_handled_total{")
            && name.contains("grpc_service=\"etcdserverpb.KV\"")
            && ETCD_KV_METHODS
                .iter()
                .any(|m| name.contains(&format!("grpc_method=\"{m}\"")));
        let watch_opened = name.starts_with("grpc_server_msg_received_total{")
            && name.contains("grpc_method=\"Watch\"");
        if name == "etcd_debugging_mvcc_events_total" {
            events = Some(value);
        } else if kv_request || watch_opened {
            requests += value;
        }
    }
    if events.is_none() {
        bail!("etcd's /metrics has no etcd_debugging_mvcc_events_total");
    }
    Ok(Reading {
        requests,
        watch_events: events,
    })
}

/// The scripts Redis ran, from `INFO commandstats`: the spinning lock's requests.
pub fn redis(url: &str) -> Result<Reading> {
    let mut connection = connect::redis(url)?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut *connection)
        .context("redis: INFO commandstats")?;
    Ok(Reading {
        requests: redis_calls(&info),
        watch_events: None,
    })
}

/// Sums `calls=` over the script commands' `cmdstat_*` lines (Redis 7 lists subcommands
/// as `cmdstat_client|setinfo`).
pub fn redis_calls(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter(|line| {
            let command = line.split([':', '|']).next().unwrap_or("");
            REDIS_SCRIPT_COMMANDS.contains(&command)
        })
        .filter_map(|line| {
            line.split([':', ','])
                .find_map(|field| field.strip_prefix("calls="))
                .and_then(|calls| calls.parse::<u64>().ok())
        })
        .sum()
}

/// A plain HTTP GET on the host of an `http://` URL, bounded in time.
fn http_get(url: &str, path: &str) -> Result<String> {
    let (endpoint, _) = connect::etcd_credentials(url);
    let host = endpoint
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("only an http:// etcd serves /metrics here"))?
        .trim_end_matches('/');
    let address = std::net::ToSocketAddrs::to_socket_addrs(host)?
        .next()
        .ok_or_else(|| anyhow!("no address for {host}"))?;
    let bound = Duration::from_secs(2);
    let mut stream = TcpStream::connect_timeout(&address, bound)?;
    stream.set_read_timeout(Some(bound))?;
    stream.set_write_timeout(Some(bound))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("no HTTP answer"))?;
    let status = head.split(' ').nth(1);
    if !head.starts_with("HTTP/1.") || status != Some("200") {
        bail!("HTTP answer: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_counts_kv_requests_and_watches_and_events_only() {
        let page = "\
# HELP etcd_debugging_mvcc_events_total Total number of events sent by this member.
etcd_debugging_mvcc_events_total 12
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 5
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Txn\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 3
grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"LeaseGrant\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"unary\"} 40
grpc_server_msg_received_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb.Watch\",grpc_type=\"bidi_stream\"} 7
grpc_server_msg_received_total{grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"} 99
";
        let reading = etcd_from_metrics(page).unwrap();
        assert_eq!(reading.requests, 15);
        assert_eq!(reading.watch_events, Some(12));
        let later = Reading {
            requests: 25,
            watch_events: Some(30),
        };
        let count = reading.until(later, "test");
        assert_eq!(count.requests, Some(10));
        assert_eq!(count.watch_events, Some(18));
    }

    #[test]
    fn a_page_without_the_events_counter_is_not_read_as_zero() {
        assert!(etcd_from_metrics("grpc_server_handled_total{} 3\n").is_err());
    }

    #[test]
    fn redis_counts_the_scripts_not_the_commands_they_run_nor_connections() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=40,usec=100,usec_per_call=2.5,rejected_calls=0,failed_calls=0\r\ncmdstat_eval:calls=2,usec=3\r\ncmdstat_info:calls=9,usec=1\r\ncmdstat_auth:calls=2,usec=1\r\ncmdstat_client|setinfo:calls=4\r\ncmdstat_set:calls=40\r\ncmdstat_incr:calls=6\r\n";
        assert_eq!(redis_calls(info), 42);
    }
}

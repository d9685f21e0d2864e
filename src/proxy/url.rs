//! Pointing a server's URL through a proxy: the worker is given the same URL (scheme,
//! password, database) with the proxy's address in place of the server's, so that a lab
//! works the same on private servers, servers given by `--redis-url` and a room's servers.

use std::net::{SocketAddr, ToSocketAddrs};

use anyhow::{Context, Result, bail};

/// The `host:port` part of `scheme://[user[:password]@]host[:port][/rest]`, and where it
/// starts and ends in the text.
fn authority(url: &str) -> Result<(usize, usize)> {
    let Some(scheme_end) = url.find("://") else {
        bail!(
            "not a URL with a host (scheme://host:port): {}",
            crate::connect::redact(url)
        );
    };
    let start = scheme_end + 3;
    let rest = &url[start..];
    let end = start + rest.find(['/', '?']).unwrap_or(rest.len());
    // The password may hold an `@` only percent-encoded, so the last one ends the user part.
    let host_start = url[start..end]
        .rfind('@')
        .map_or(start, |at| start + at + 1);
    Ok((host_start, end))
}

fn default_port(url: &str) -> u16 {
    match url.split("://").next().unwrap_or_default() {
        "redis" | "rediss" => 6379,
        "postgres" | "postgresql" => 5432,
        "https" => 443,
        "http" => 2379,
        _ => 0,
    }
}

/// Where the server of `url` listens (its host resolved, IPv4 first).
pub fn upstream_of(url: &str) -> Result<SocketAddr> {
    let (start, end) = authority(url)?;
    let host_port = &url[start..end];
    let with_port = if host_port
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
        && !host_port.ends_with(']')
    {
        host_port.to_string()
    } else {
        format!("{host_port}:{}", default_port(url))
    };
    let mut addrs: Vec<SocketAddr> = with_port
        .to_socket_addrs()
        .with_context(|| format!("resolving {with_port} for the fault proxy"))?
        .collect();
    addrs.sort_by_key(|addr| !addr.is_ipv4());
    addrs
        .into_iter()
        .next()
        .with_context(|| format!("{with_port} resolves to no address"))
}

/// `url` with the proxy's address in place of the server's.
pub fn through(url: &str, proxy: SocketAddr) -> Result<String> {
    let (start, end) = authority(url)?;
    Ok(format!("{}{proxy}{}", &url[..start], &url[end..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_keeps_everything_but_its_address() {
        let proxy: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        assert_eq!(
            through("redis://default:s3cret@127.0.0.1:6379/0", proxy).unwrap(),
            "redis://default:s3cret@127.0.0.1:41234/0"
        );
        assert_eq!(
            through(
                "postgres://lockslab:pw@localhost/lockslab?sslmode=disable",
                proxy
            )
            .unwrap(),
            "postgres://lockslab:pw@127.0.0.1:41234/lockslab?sslmode=disable"
        );
        assert_eq!(
            through("http://127.0.0.1:2379", proxy).unwrap(),
            "http://127.0.0.1:41234"
        );
        assert!(through("host=localhost port=5432", proxy).is_err());
    }

    #[test]
    fn the_upstream_is_the_urls_own_address() {
        assert_eq!(
            upstream_of("redis://:pw@127.0.0.1:6390").unwrap(),
            "127.0.0.1:6390".parse().unwrap()
        );
        assert_eq!(
            upstream_of("postgres://u:p@127.0.0.1/db").unwrap(),
            "127.0.0.1:5432".parse().unwrap()
        );
        assert_eq!(
            upstream_of("postgres://u:p@localhost:5499/db")
                .unwrap()
                .port(),
            5499
        );
    }
}

//! A Redis in a host: reached by the other hosts at the host's address, and by lockslab
//! at its Unix socket, the control line no partition cuts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::Hosts;
use crate::connect::Backend;

/// The port every hosted Redis listens on: each host has an address of its own.
pub const PORT: u16 = 6379;

/// The port a hosted Sentinel listens on (Sentinel's usual one).
pub const SENTINEL_PORT: u16 = 26379;

/// A `redis-server` running in one host.
pub struct HostedRedis {
    /// The host it runs in, which is also its name in the history.
    pub host: String,
    child: Option<Child>,
    /// `redis://…@10.77.0.n:6379`: for a client in another host.
    pub url: String,
    /// Its Unix socket: for lockslab itself.
    pub socket: PathBuf,
    password: String,
}

impl Hosts {
    /// Starts a Redis in `host` (its files in `dir`, its password `password`) and waits
    /// until it answers on its socket.
    pub fn start_redis(&self, host: &str, dir: &Path, password: &str) -> Result<HostedRedis> {
        self.start_redis_with(host, dir, password, "")
    }

    /// [`Hosts::start_redis`], its configuration ending with `more` (lines such as
    /// `replicaof 10.77.0.1 6379`): the primary and the replica of a Sentinel cluster.
    /// Every hosted Redis gives its password to the primary it follows (`masterauth`), so
    /// that any of them can be made a replica of another, as Sentinel does.
    pub fn start_redis_with(
        &self,
        host: &str,
        dir: &Path,
        password: &str,
        more: &str,
    ) -> Result<HostedRedis> {
        // No persistence: what a node knows is in its memory only. A replica syncs over the
        // socket at once (Redis waits 5s by default for more replicas to share the sync).
        let conf = format!(
            "masterauth {password}\nappendonly no\nsave \"\"\n\
             repl-diskless-sync yes\nrepl-diskless-sync-delay 0\n{more}"
        );
        self.start_server(host, dir, password, (PORT, "redis"), &conf)
    }

    /// Starts a Sentinel (`redis-server --sentinel`) in `host`, watching the primary
    /// `watch` names, and waits until it answers on its socket. Its configuration file is
    /// its own and writable: a Sentinel rewrites it as it learns the other Sentinels, the
    /// replicas and each failover.
    pub fn start_sentinel(
        &self,
        host: &str,
        dir: &Path,
        password: &str,
        watch: &Watch,
    ) -> Result<HostedRedis> {
        let primary = self.addr(&watch.primary_host)?;
        let name = &watch.name;
        // `requirepass`: clients must give it, and this Sentinel gives it to the other
        // Sentinels (so they all share it); `auth-pass`: what it gives the Redis nodes.
        let conf = format!(
            "sentinel monitor {name} {primary} {PORT} {quorum}\n\
             sentinel auth-pass {name} {password}\n\
             sentinel down-after-milliseconds {name} {down}\n\
             sentinel failover-timeout {name} {failover}\n\
             sentinel parallel-syncs {name} 1\n",
            quorum = watch.quorum,
            down = watch.down_after.as_millis(),
            failover = watch.failover_timeout.as_millis(),
        );
        self.start_server(host, dir, password, (SENTINEL_PORT, "sentinel"), &conf)
    }

    /// Writes the server's configuration (bound to the host's address, a Unix socket for
    /// lockslab, then `more`) and starts it in `host`.
    fn start_server(
        &self,
        host: &str,
        dir: &Path,
        password: &str,
        (port, kind): (u16, &str),
        more: &str,
    ) -> Result<HostedRedis> {
        check_password(password)?;
        let addr = self.addr(host)?;
        let socket = dir.join(format!("{kind}-{host}.sock"));
        let conf = dir.join(format!("{kind}-{host}.conf"));
        // The password in a file of the run's own directory, not on the command line.
        std::fs::write(
            &conf,
            format!(
                "requirepass {password}\nbind {addr}\nport {port}\nunixsocket {}\n\
                 unixsocketperm 700\ndir {}\n{more}",
                socket.display(),
                dir.display()
            ),
        )?;
        let log = std::fs::File::create(dir.join(format!("{kind}-{host}.log")))?;
        let mut command =
            Command::new(crate::servers::find_binary("redis-server", Backend::Redis)?);
        command.arg(&conf);
        if kind == "sentinel" {
            command.arg("--sentinel");
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = self.start_in(host, &mut command)?;
        let redis = HostedRedis {
            host: host.into(),
            child: Some(child),
            url: format!("redis://default:{password}@{addr}:{port}"),
            socket,
            password: password.into(),
        };
        redis.wait_until_answering(Duration::from_secs(20))?;
        Ok(redis)
    }
}

/// What a Sentinel watches, and how quickly it gives a silent primary up.
pub struct Watch {
    /// The name clients ask for (`SENTINEL get-master-addr-by-name`).
    pub name: String,
    /// The host the primary runs in (on [`PORT`]).
    pub primary_host: String,
    /// How many Sentinels must agree that the primary is down before one of them may
    /// start a failover (which also needs a majority of all Sentinels to elect it).
    pub quorum: usize,
    /// How long the primary may go unanswering before this Sentinel calls it down.
    pub down_after: Duration,
    /// Sentinel's failover timeout: how long a failover may take, and the wait before the
    /// same primary is failed over again.
    pub failover_timeout: Duration,
}

impl HostedRedis {
    /// The URL lockslab reaches it at: its socket.
    pub fn control_url(&self) -> String {
        format!(
            "redis+unix://{}?user=default&pass={}",
            self.socket.display(),
            self.password
        )
    }

    /// A connection over its socket, for lockslab's own questions.
    pub fn control(&self) -> Result<redis::Connection> {
        let client = redis::Client::open(self.control_url())?;
        let timeout = Some(Duration::from_secs(5));
        let connection = client.get_connection_with_timeout(Duration::from_secs(5))?;
        connection.set_read_timeout(timeout)?;
        Ok(connection)
    }

    fn wait_until_answering(&self, patience: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let answer = self.control().and_then(|mut c| {
                let pong: String = redis::cmd("PING").query(&mut c)?;
                Ok(pong)
            });
            match answer {
                Ok(_) => return Ok(()),
                Err(err) if started.elapsed() > patience => {
                    return Err(err).with_context(|| {
                        format!(
                            "the Redis in host {} did not answer on its socket",
                            self.host
                        )
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl HostedRedis {
    /// Its process, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill_now(&mut self) {
        super::kill_started(&mut self.child);
    }
}

impl Drop for HostedRedis {
    fn drop(&mut self) {
        self.kill_now();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Refuses a password that would break the config line or the control URL.
fn check_password(password: &str) -> Result<()> {
    if !password.chars().all(|c| c.is_ascii_alphanumeric()) {
        bail!("a hosted Redis's password is letters and digits only");
    }
    Ok(())
}

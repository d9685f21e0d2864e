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
        check_password(password)?;
        let addr = self.addr(host)?;
        let socket = dir.join(format!("redis-{host}.sock"));
        let conf = dir.join(format!("redis-{host}.conf"));
        // The password in a file of the run's own directory, not on the command line.
        std::fs::write(
            &conf,
            format!(
                "requirepass {password}\nbind {addr}\nport {PORT}\nunixsocket {}\n\
                 unixsocketperm 700\nsave \"\"\nappendonly no\ndir {}\n",
                socket.display(),
                dir.display()
            ),
        )?;
        let log = std::fs::File::create(dir.join(format!("redis-{host}.log")))?;
        let mut command =
            Command::new(crate::servers::find_binary("redis-server", Backend::Redis)?);
        command
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = self.start_in(host, &mut command)?;
        let redis = HostedRedis {
            host: host.into(),
            child: Some(child),
            url: format!("redis://default:{password}@{addr}:{PORT}"),
            socket,
            password: password.into(),
        };
        redis.wait_until_answering(Duration::from_secs(20))?;
        Ok(redis)
    }
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

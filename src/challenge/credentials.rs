//! The Redis and etcd logins a challenge's clients get: a user of the run's own on each,
//! reaching only the run's keys (`lockslab:<run id>:…`), made before the clients start and
//! removed after them.
//!
//! Why not lockslab's own logins: on the servers lockslab starts, those are Redis's
//! `default` user and etcd's `root` — the instructor's. With them a client could read every
//! seat's keys, rewrite the etcd users, and (since one password opens all three servers) log
//! in to Postgres as the labs' role. A client is graded, not trusted: it gets what its run
//! needs and nothing lockslab's admin has.
//!
//! A server lockslab was given (a URL of the learner's) may refuse to make users (no ACL
//! rights, etcd without auth): the clients then share the given login, and the heading says
//! so.

use anyhow::{Context, Result};

use crate::connect;
use crate::servers::with_user;

/// The logins handed to clients in `init`, and how to take them back.
#[derive(Clone)]
pub struct ClientLogins {
    pub redis_url: String,
    pub etcd_url: String,
    /// Whether each is a user of the run's own (false: the given login, shared).
    pub redis_own: bool,
    pub etcd_own: bool,
    user: String,
    admin_redis: String,
    admin_etcd: String,
}

/// The user name every server gets for this run's clients.
fn user_of(run_id: &str) -> String {
    format!("lockslab_client_{run_id}")
}

/// The ACL of a run's clients on Redis: the run's keys, the commands a lock client sends
/// (strings, expiry, scripts, transactions), nothing Redis marks dangerous — no `CONFIG`,
/// `KEYS`, `ACL`, `CLIENT KILL`, `DEBUG`, `SHUTDOWN` — no functions, no channels.
fn redis_rules(user_password: &str, key_prefix: &str) -> Vec<String> {
    crate::servers::lab_redis_acl(user_password, &format!("{key_prefix}*"), &["+wait"], &[])
}

impl ClientLogins {
    /// Makes the run's users on the Redis and etcd at `redis` and `etcd` (lockslab's own
    /// logins), reaching `key_prefix` only. A server that refuses keeps its given login.
    pub fn make(redis: &str, etcd: &str, run_id: &str, key_prefix: &str) -> ClientLogins {
        let user = user_of(run_id);
        let password = crate::seed::os_hex(24);
        let redis_own = make_redis_user(redis, &user, &password, key_prefix).is_ok();
        let etcd_own = make_etcd_user(etcd, &user, &password, key_prefix).is_ok();
        ClientLogins {
            redis_url: if redis_own {
                with_user(redis, &user, &password)
            } else {
                redis.to_string()
            },
            etcd_url: if etcd_own {
                with_user(etcd, &user, &password)
            } else {
                etcd.to_string()
            },
            redis_own,
            etcd_own,
            user,
            admin_redis: redis.to_string(),
            admin_etcd: etcd.to_string(),
        }
    }

    /// Whether the clients share a login of lockslab's on either server.
    pub fn shared(&self) -> bool {
        !(self.redis_own && self.etcd_own)
    }

    /// Removes the run's users (their keys go with the run's other leftovers).
    pub fn remove(&self) {
        if self.redis_own {
            let _ = connect::redis(&self.admin_redis).and_then(|mut redis| {
                redis::cmd("ACL")
                    .arg("DELUSER")
                    .arg(&self.user)
                    .query::<i64>(&mut *redis)
                    .map_err(anyhow::Error::from)
            });
        }
        if self.etcd_own {
            let user = self.user.clone();
            let _ = connect::etcd_runtime().and_then(|runtime| {
                runtime.block_on(async {
                    let mut client = connect::etcd(&self.admin_etcd).await?;
                    client.user_delete(user.as_str()).await?;
                    client.role_delete(user.as_str()).await?;
                    anyhow::Ok(())
                })
            });
        }
    }
}

fn make_redis_user(url: &str, user: &str, password: &str, key_prefix: &str) -> Result<()> {
    let mut redis = connect::redis(url)?;
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(user)
        .arg(redis_rules(password, key_prefix))
        .query::<()>(&mut *redis)
        .context("ACL SETUSER")
}

/// An etcd user and role of the run's own; only where etcd checks logins (lockslab's own
/// etcd does; one without auth would let the user's name mean nothing).
fn make_etcd_user(url: &str, user: &str, password: &str, key_prefix: &str) -> Result<()> {
    if connect::etcd_credentials(url).1.is_none() {
        anyhow::bail!("etcd without a login: nothing to give the clients of their own");
    }
    connect::etcd_runtime()?.block_on(async {
        let mut client = connect::etcd(url).await?;
        client.role_add(user).await?;
        client
            .role_grant_permission(
                user,
                etcd_client::Permission::read_write(key_prefix).with_prefix(),
            )
            .await?;
        client.user_add(user, password, None).await?;
        client.user_grant_role(user, user).await?;
        anyhow::Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clients_redis_acl_reaches_the_runs_keys_only_and_no_dangerous_command() {
        let rules = redis_rules("pw", "lockslab:abc:");
        assert!(rules.contains(&"~lockslab:abc:*".to_string()));
        assert!(
            !rules
                .iter()
                .any(|r| r == "allkeys" || r == "~*" || r == "+@all")
        );
        let dangerous = rules.iter().position(|r| r == "-@dangerous").unwrap();
        assert_eq!(rules.last().unwrap(), "-function");
        assert!(dangerous > rules.iter().position(|r| r == "+@write").unwrap());
    }
}

//! Lab 4 — `lockslab etcd-vs-redis` (being written; see issue for lab 4).

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::OutputArgs;
use crate::servers::ServerArgs;

#[derive(clap::Args, Debug)]
pub struct EtcdVsRedisArgs {
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// One worker's script.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Role {
    pub name: String,
}

pub fn run(_args: &EtcdVsRedisArgs) -> Result<()> {
    bail!("lab 4 (`lockslab etcd-vs-redis`) is not built yet")
}

pub fn work(_role: &Role) -> Result<()> {
    bail!("lab 4 has no workers yet")
}

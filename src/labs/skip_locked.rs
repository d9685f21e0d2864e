//! Lab 3 — `lockslab skip-locked` (being written; see issue for lab 3).

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::OutputArgs;
use crate::servers::ServerArgs;

#[derive(clap::Args, Debug)]
pub struct SkipLockedArgs {
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

pub fn run(_args: &SkipLockedArgs) -> Result<()> {
    bail!("lab 3 (`lockslab skip-locked`) is not built yet")
}

pub fn work(_role: &Role) -> Result<()> {
    bail!("lab 3 has no workers yet")
}

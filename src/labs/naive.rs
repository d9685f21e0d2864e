//! Lab 2 — `lockslab naive` (being written; see issue for lab 2).

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::OutputArgs;
use crate::servers::ServerArgs;

#[derive(clap::Args, Debug)]
pub struct NaiveArgs {
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

pub fn run(_args: &NaiveArgs) -> Result<()> {
    bail!("lab 2 (`lockslab naive`) is not built yet")
}

pub fn work(_role: &Role) -> Result<()> {
    bail!("lab 2 has no workers yet")
}

//! The sides of a partition, and which pairs of hosts it cuts.
//!
//! Written `m1|m2,m3` (sides split by `|`, hosts in a side by `,`), as a schedule's
//! `partition` step names its target:
//!
//! - **one side** (`m1`): those hosts are cut off from every other host — one host
//!   isolated, or a minority (`m1,m2`) away from the rest;
//! - **several sides** (`m1,m2|m4,m5`): every pair across two sides is cut; a host named
//!   in no side keeps all its links — a **bridge** that sees both sides (`m3` here), as
//!   the node of a flaky switch that still reaches everyone.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sides(Vec<Vec<String>>);

impl Sides {
    pub fn new(sides: &[&[&str]]) -> Sides {
        Sides(
            (sides.iter())
                .map(|side| side.iter().map(|h| h.to_string()).collect())
                .collect(),
        )
    }

    /// Every host the sides name.
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.0.iter().flatten().map(String::as_str)
    }

    /// The pairs of `hosts` these sides cut apart, each once. Refuses a side naming a host
    /// that is not one of them, or a host on two sides.
    pub fn pairs(&self, hosts: &[&str]) -> Result<Vec<(String, String)>> {
        let mut seen: Vec<&str> = Vec::new();
        for host in self.named() {
            if !hosts.contains(&host) {
                bail!(
                    "the partition {self} names '{host}', which is not a host (the hosts: {})",
                    hosts.join(", ")
                );
            }
            if seen.contains(&host) {
                bail!("the partition {self} puts '{host}' on two sides");
            }
            seen.push(host);
        }
        let side_of = |host: &str| {
            self.0
                .iter()
                .position(|side| side.iter().any(|h| h == host))
        };
        let mut pairs = Vec::new();
        for (i, a) in hosts.iter().enumerate() {
            for b in &hosts[i + 1..] {
                let apart = match (side_of(a), side_of(b)) {
                    // One side: it against everyone else.
                    (Some(_), None) | (None, Some(_)) => self.0.len() == 1,
                    (Some(x), Some(y)) => x != y,
                    (None, None) => false,
                };
                if apart {
                    pairs.push((a.to_string(), b.to_string()));
                }
            }
        }
        Ok(pairs)
    }
}

impl FromStr for Sides {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> Result<Sides> {
        let sides: Vec<Vec<String>> = (text.split('|'))
            .map(|side| {
                (side.split(','))
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
                    .collect()
            })
            .collect();
        if sides.iter().any(Vec::is_empty) {
            bail!(
                "a partition is written as its sides, hosts split by ',' and sides by '|' \
                 (m1|m2,m3): '{text}' has an empty side"
            );
        }
        Ok(Sides(sides))
    }
}

impl fmt::Display for Sides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sides: Vec<String> = self.0.iter().map(|side| side.join(",")).collect();
        f.write_str(&sides.join("|"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIVE: [&str; 5] = ["m1", "m2", "m3", "m4", "m5"];

    fn pairs(text: &str) -> Vec<String> {
        let sides: Sides = text.parse().unwrap();
        (sides.pairs(&FIVE).unwrap().into_iter())
            .map(|(a, b)| format!("{a}-{b}"))
            .collect()
    }

    #[test]
    fn one_side_is_cut_off_from_every_other_host() {
        assert_eq!(pairs("m1"), ["m1-m2", "m1-m3", "m1-m4", "m1-m5"]);
        assert_eq!(
            pairs("m1,m2").len(),
            6,
            "a minority of two against three: 2 × 3 links"
        );
    }

    #[test]
    fn a_host_on_no_side_bridges_the_sides() {
        let cut = pairs("m1,m2|m4,m5");
        assert_eq!(cut, ["m1-m4", "m1-m5", "m2-m4", "m2-m5"]);
        assert!(!cut.iter().any(|pair| pair.contains("m3")));
    }

    #[test]
    fn a_partition_names_only_hosts_each_on_one_side() {
        let unknown: Sides = "m1|m9".parse().unwrap();
        assert!(unknown.pairs(&FIVE).is_err());
        let twice: Sides = "m1|m1,m2".parse().unwrap();
        assert!(twice.pairs(&FIVE).is_err());
        assert!("m1||m2".parse::<Sides>().is_err());
        assert_eq!(
            "m1, m2|m3".parse::<Sides>().unwrap().to_string(),
            "m1,m2|m3"
        );
    }
}

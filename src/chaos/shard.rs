//! `--shard K/N`: one part of many of a long run, played on another machine, its
//! `--json` merged afterwards (`lockslab matrix --merge`). `chaos` splits its schedules
//! this way, `matrix` its cells.

use anyhow::Result;

use crate::output::count;

/// `--shard K/N`: the K-th of N parts (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    pub k: u32,
    pub n: u32,
}

impl Shard {
    /// Does this part play the `index`th cell (or schedule)?
    pub fn owns(self, index: u64) -> bool {
        index % u64::from(self.n) == u64::from(self.k - 1)
    }

    /// Refuses a split of `items` (schedules, or cells) into more parts than there are
    /// items: a part past them plays none, and would exit 0 as if it had found nothing.
    /// `what`: the item's name, one and many; `more`: the flags that give more of them.
    pub fn every_part_plays(self, items: u64, what: (&str, &str), more: &str) -> Result<()> {
        let (k, n) = (self.k, self.n);
        if u64::from(n) <= items {
            return Ok(());
        }
        let none = if u64::from(k) > items {
            "plays none".to_string()
        } else if u64::from(n) == items + 1 {
            format!("leaves part {n}/{n} none")
        } else {
            format!("leaves parts {}/{n} to {n}/{n} none", items + 1)
        };
        let fewer = match items {
            1 => "drop --shard".to_string(),
            _ => format!("use at most --shard K/{items}"),
        };
        crate::bail_usage!(
            "--shard {k}/{n} of {} {none}: {fewer}, or {more}",
            count(items, what.0, what.1)
        );
    }
}

pub fn parse_shard(text: &str) -> Result<Shard, String> {
    let parsed = text
        .split_once('/')
        .and_then(|(k, n)| Some((k.parse::<u32>().ok()?, n.parse::<u32>().ok()?)));
    match parsed {
        Some((k, n)) if (1..=n).contains(&k) => Ok(Shard { k, n }),
        _ => Err(format!("{text}: K/N with 1 ≤ K ≤ N, e.g. 2/4")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_split_the_cells_between_them_and_k_over_n_is_checked() {
        let shards: Vec<Shard> = (1..=3)
            .map(|k| parse_shard(&format!("{k}/3")).unwrap())
            .collect();
        for index in 0..30u64 {
            let owners = shards.iter().filter(|s| s.owns(index)).count();
            assert_eq!(owners, 1, "cell {index} is played by exactly one part");
        }
        for bad in ["0/3", "4/3", "3", "a/b", "1/0"] {
            assert!(parse_shard(bad).is_err(), "{bad}");
        }
    }

    /// A part past the items plays none and would exit 0: refused, with what to do.
    #[test]
    fn a_split_into_more_parts_than_items_is_refused_with_what_to_do() {
        let schedules = ("schedule", "schedules");
        let refused = |shard: &str, items: u64| {
            let shard = parse_shard(shard).unwrap();
            let err = shard.every_part_plays(items, schedules, "more --schedules");
            let err = err.unwrap_err();
            assert!(err.downcast_ref::<crate::exit::UsageError>().is_some());
            format!("{err}")
        };
        assert_eq!(
            refused("3/3", 2),
            "--shard 3/3 of 2 schedules plays none: use at most --shard K/2, or more --schedules"
        );
        let message = refused("1/4294967295", 10);
        assert!(
            message.contains("leaves parts 11/4294967295 to 4294967295/4294967295 none"),
            "{message}"
        );
        assert!(refused("2/2", 1).contains("drop --shard"));
        for (shard, items) in [("2/2", 2), ("1/3", 30), ("1/1", 1)] {
            let shard = parse_shard(shard).unwrap();
            assert!(shard.every_part_plays(items, schedules, "").is_ok());
        }
    }
}

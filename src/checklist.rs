//! `lockslab checklist`: the questions to answer before shipping code that leans on a
//! distributed lock, each beside the lab that shows what goes wrong without it.
//!
//! On a terminal it asks them one by one and ends with the labs to run for the questions
//! not answered; `--markdown` prints them as a list to paste into a design review.

use std::io::{BufRead, IsTerminal};

use anyhow::Result;
use colored::Colorize;

/// One question of the checklist.
pub struct Item {
    pub question: &'static str,
    /// Why it matters: what goes wrong when the answer is no.
    pub without: &'static str,
    /// The command that shows it, and the walkthrough that explains it.
    pub command: &'static str,
    pub walkthrough: &'static str,
}

pub const ITEMS: &[Item] = &[
    Item {
        question: "Is the lock there for efficiency (two holders only waste work) or for correctness (two holders corrupt data)?",
        without: "a lease lock alone lets two holders act when the first one pauses past its lease: fine for saving work, not for guarding data",
        command: "lockslab gc-pause --fencing off",
        walkthrough: "labs/01-gc-pause.md",
    },
    Item {
        question: "Does the protected resource itself refuse a stale holder: a fencing token or a version, checked in the same atomic write?",
        without: "a holder that woke after its lease ran out writes over the next holder's work, and nothing notices",
        command: "lockslab gc-pause",
        walkthrough: "labs/01-gc-pause.md",
    },
    Item {
        question: "Is the read of a read-modify-write fenced too, not only the write?",
        without: "a fenced write can still carry a value computed from a stale read",
        command: "lockslab no-lock fenced-write-only",
        walkthrough: "labs/07-no-lock.md",
    },
    Item {
        question: "Can the token's source ever go back (a Redis restarting without its data, a failover to a replica that missed the INCR)?",
        without: "tokens are handed out again, and the resource's check accepts the stale holder's equal token",
        command: "lockslab gc-pause --token-restart",
        walkthrough: "labs/01-gc-pause.md",
    },
    Item {
        question: "Is taking the lock one atomic command (SET NX PX, an etcd transaction), not a check followed by a set?",
        without: "several clients see the lock free and all take it",
        command: "lockslab naive race",
        walkthrough: "labs/02-naive.md",
    },
    Item {
        question: "Is the lock's expiry set in the same command that takes it?",
        without: "a holder that dies between the two leaves a lock that never expires",
        command: "lockslab naive setnx-expire",
        walkthrough: "labs/02-naive.md",
    },
    Item {
        question: "Does a release delete only its own lock (compare the owner value, then delete, atomically)?",
        without: "a holder whose lease ran out deletes the next holder's lock, and a third client walks in",
        command: "lockslab naive wrong-release",
        walkthrough: "labs/02-naive.md",
    },
    Item {
        question: "Are the client's deadlines measured on a monotonic clock, from when the request was sent, minus a margin?",
        without: "a wall clock that steps back makes an expired lease look valid",
        command: "lockslab lease-guard --fault clock-back",
        walkthrough: "labs/09-lease-guard.md",
    },
    Item {
        question: "If the holder's write is delayed in the network past its lease, what stops it?",
        without: "checking the lock just before writing does not help: the write was sent in time and arrives late",
        command: "lockslab network",
        walkthrough: "labs/08-network.md",
    },
    Item {
        question: "When a request gets no answer (a lost reply), does the retry reuse the owner value or the idempotency key it sent first, and is the lease counted from that first send?",
        without: "a retry with a new value waits behind its own lock, one that gives up leaves a lock nobody holds, and a retried COMMIT pays twice",
        command: "lockslab network --scenario lost-reply",
        walkthrough: "labs/08-network.md",
    },
    Item {
        question: "When a holder crashes, how long does the lock stay unavailable, and can the service live with that?",
        without: "a dead holder's lock stands until its lease runs out (or forever, with no lease)",
        command: "lockslab etcd-vs-redis --kill",
        walkthrough: "labs/04-etcd-vs-redis.md",
    },
    Item {
        question: "Does the lock survive a failover of its server without being granted twice?",
        without: "Redis replicates asynchronously: a promoted replica may not know the lock, and grants it again",
        command: "lockslab failover",
        walkthrough: "labs/05-failover.md",
    },
    Item {
        question: "If you use Redlock: which of its timing assumptions does your system guarantee (bounded pauses, clocks that do not jump, masters that restart with their data)?",
        without: "a master restarting empty or a clock jump lets a second client reach a majority",
        command: "lockslab redlock",
        walkthrough: "labs/06-redlock.md",
    },
    Item {
        question: "With many waiters, does a release wake one of them or all, and do they get the lock in the order they asked?",
        without: "every release sets off a herd of requests, and a waiter can starve",
        command: "lockslab queue",
        walkthrough: "labs/10-queue.md",
    },
    Item {
        question: "Did you rule out doing without a lock: a version check, an idempotency key, partitioning the work, the database's own lock?",
        without: "a lock across machines is the hardest of these to get right, and often not needed",
        command: "lockslab no-lock",
        walkthrough: "labs/07-no-lock.md",
    },
];

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Examples:
  lockslab checklist             ask each question; list the labs to run
  lockslab checklist --markdown  a task list to paste into a design review")]
pub struct ChecklistArgs {
    /// Print the checklist as Markdown (a task list) instead of asking
    #[arg(long)]
    pub markdown: bool,
}

pub fn run(args: &ChecklistArgs) -> Result<()> {
    if args.markdown {
        crate::outln!("{}", markdown());
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        print_all();
        return Ok(());
    }
    ask()
}

/// The checklist as a Markdown task list.
pub fn markdown() -> String {
    let mut text = String::from(
        "## Before shipping code that depends on a distributed lock\n\n\
         Each item names the lockslab command that shows what goes wrong without it.\n\n",
    );
    for item in ITEMS {
        text.push_str(&format!(
            "- [ ] {}\n  - Without it: {}.\n  - See: `{}` ({})\n",
            item.question, item.without, item.command, item.walkthrough
        ));
    }
    text
}

fn print_all() {
    crate::output::prose("Before shipping code that depends on a distributed lock:");
    for (number, item) in ITEMS.iter().enumerate() {
        crate::output::prose("");
        print_item(number, item);
    }
}

fn print_item(number: usize, item: &Item) {
    hang(
        &format!("{:>2}. ", number + 1),
        &item.question.bold().to_string(),
    );
    hang("    ", &format!("Without it: {}.", item.without));
    hang(
        "    ",
        &format!("See: {} ({})", item.command.cyan(), item.walkthrough),
    );
}

/// `text` after `prefix`, wrapped to the terminal, continuation lines under the text.
fn hang(prefix: &str, text: &str) {
    let room = crate::output::width().saturating_sub(prefix.len()).max(20);
    for (i, line) in crate::output::wrap(text, room).iter().enumerate() {
        let lead = if i == 0 {
            prefix.to_string()
        } else {
            " ".repeat(prefix.len())
        };
        crate::outln!("{lead}{line}");
    }
}

/// Asks each question on the terminal; ends with the labs for those not answered yes.
fn ask() -> Result<()> {
    crate::output::prose(
        "Answer each question for your design: y (answered), n or ? or Enter (no, or not sure), q (stop).",
    );
    let mut open: Vec<&Item> = Vec::new();
    let mut answered = 0;
    let mut asked = 0;
    let stdin = std::io::stdin();
    for (number, item) in ITEMS.iter().enumerate() {
        crate::output::prose("");
        print_item(number, item);
        let answer = loop {
            crate::outln!("    {}", "Answered? y / n (or ?) / q, then Enter".dimmed());
            let mut line = String::new();
            if stdin.lock().read_line(&mut line)? == 0 {
                break 'q';
            }
            match line.trim().to_lowercase().as_str() {
                "y" | "yes" => break 'y',
                "n" | "no" | "?" | "" => break 'n',
                "q" | "quit" => break 'q',
                _ => crate::outln!("    (y, n or q)"),
            }
        };
        match answer {
            'y' => answered += 1,
            'q' => break,
            _ => open.push(item),
        }
        asked += 1;
    }
    crate::output::prose("");
    crate::output::prose(&format!("{answered} of {} answered.", ITEMS.len()));
    if asked < ITEMS.len() {
        crate::output::prose(&format!(
            "{} not asked: `lockslab checklist --markdown` lists them all.",
            ITEMS.len() - asked
        ));
    }
    if !open.is_empty() {
        crate::output::prose("Run these to see what goes wrong where you answered no:");
        for item in open {
            crate::output::prose(&format!(
                "  {}  ({})",
                item.command.cyan(),
                item.walkthrough
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command the checklist names is one the CLI takes, and every walkthrough exists.
    #[test]
    fn every_item_points_at_a_real_command_and_walkthrough() {
        use clap::CommandFactory;
        for item in ITEMS {
            let words: Vec<&str> = item.command.split_whitespace().collect();
            assert_eq!(words[0], "lockslab");
            crate::cli::Cli::command()
                .try_get_matches_from(&words)
                .unwrap_or_else(|e| panic!("{}: {e}", item.command));
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(item.walkthrough);
            assert!(path.exists(), "{}", item.walkthrough);
        }
    }

    #[test]
    fn the_markdown_has_one_task_per_item() {
        let text = markdown();
        assert_eq!(text.matches("- [ ] ").count(), ITEMS.len());
    }
}

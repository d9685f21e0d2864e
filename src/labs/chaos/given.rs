//! What a learner hands chaos by hand: a schedule in a file.

/// A schedule file's text: a regular file of at most 1 MiB (not a FIFO, a device or
/// /dev/zero, which would hang or fill the memory).
pub fn read_small_file(path: &str) -> std::io::Result<String> {
    use std::io::{Error, Read};
    const LIMIT: u64 = 1 << 20;
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(Error::other("not a regular file"));
    }
    if meta.len() > LIMIT {
        return Err(Error::other("over 1 MiB: a schedule is a few lines"));
    }
    let mut text = String::new();
    file.take(LIMIT).read_to_string(&mut text)?;
    Ok(text)
}

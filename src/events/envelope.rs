//! The envelope: what a run's verdict line says about itself — that it is a verdict, the
//! shape of `--json` it was written in, which lab or tool wrote it, and the run's id —
//! beside what the run found. Every verdict line is built here, by the labs' runner and
//! by the tools (`chaos`, `matrix`, `challenge`) alike, and every reader of a saved run
//! (`lockslab check`, `lockslab render`) reads those fields back through here, so that the
//! version's field has one spelling and one meaning.
//!
//! ```text
//! {"kind": "verdict", "json_version": 5, "lab": "gc-pause", "run_id": "3f2a91c0", ...the run's fields}
//! ```

use anyhow::{Result, bail};
use serde_json::{Map, Value};

use super::JSON_VERSION;

/// The field that names the shape of `--json` a line was written in ([`JSON_VERSION`]).
pub const VERSION_FIELD: &str = "json_version";

/// The envelope's fields: they say what the line is, not what the run found, so a
/// comparison of two verdicts leaves them out.
pub const FIELDS: [&str; 4] = ["kind", VERSION_FIELD, "lab", "run_id"];

/// The verdict line of one run of `lab` (a lab's subcommand, or `chaos`, `matrix`,
/// `challenge`): the envelope first, then the run's own fields. A run's field cannot
/// overwrite the envelope's.
pub fn verdict(lab: &str, run_id: &str, fields: Map<String, Value>) -> Value {
    let mut object = Map::new();
    object.insert("kind".into(), "verdict".into());
    object.insert(VERSION_FIELD.into(), JSON_VERSION.into());
    object.insert("lab".into(), lab.into());
    object.insert("run_id".into(), run_id.into());
    for (key, value) in fields {
        object.entry(key).or_insert(value);
    }
    Value::Object(object)
}

/// [`verdict`] from a `json!({...})` object of the run's fields (anything else adds none).
pub fn verdict_of(lab: &str, run_id: &str, fields: Value) -> Value {
    match fields {
        Value::Object(fields) => verdict(lab, run_id, fields),
        _ => verdict(lab, run_id, Map::new()),
    }
}

/// The `--json` shape a saved verdict line says it was written in (`None` when it does not
/// say: a line from before lines said so, read as this one).
pub fn version_of(verdict: &Value) -> Option<u64> {
    verdict.get(VERSION_FIELD).and_then(Value::as_u64)
}

/// Refuses a saved run written by a newer lockslab, whose fields may mean what this one
/// does not know; `verb` is what was asked of it ("check", "render"), for the advice.
pub fn readable(verdict: &Value, verb: &str) -> Result<()> {
    if let Some(version) = version_of(verdict)
        && version > u64::from(JSON_VERSION)
    {
        bail!(
            "it was written by a newer lockslab ({VERSION_FIELD} {version}; this lockslab {} \
             reads up to {JSON_VERSION}): {verb} it with the lockslab that recorded it",
            env!("CARGO_PKG_VERSION"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envelope_names_the_lab_and_a_run_cannot_overwrite_it() {
        let mut fields = Map::new();
        fields.insert("lab".into(), "other".into());
        fields.insert("ttl_ms".into(), 2000.into());
        let object = verdict("gc-pause", "3f2a91c0", fields);
        assert_eq!(object["kind"], "verdict");
        assert_eq!(version_of(&object), Some(u64::from(JSON_VERSION)));
        assert_eq!(object["run_id"], "3f2a91c0");
        assert_eq!(object["lab"], "gc-pause");
        assert_eq!(object["ttl_ms"], 2000);
        assert!(FIELDS.iter().all(|field| object.get(field).is_some()));
    }

    #[test]
    fn a_newer_shape_is_refused_and_an_older_or_unsaid_one_read() {
        let written_in = |version: u32| {
            let mut line = verdict("gc-pause", "x", Map::new());
            line[VERSION_FIELD] = version.into();
            line
        };
        let newer = written_in(JSON_VERSION + 1);
        let said = readable(&newer, "check").unwrap_err().to_string();
        assert!(said.contains("written by a newer lockslab"), "{said}");
        assert!(said.contains("check it with"), "{said}");
        assert!(readable(&written_in(1), "check").is_ok());
        assert!(readable(&serde_json::json!({"kind": "verdict"}), "render").is_ok());
    }
}

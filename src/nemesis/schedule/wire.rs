//! A schedule in JSON: one array, a fault step per entry (its [`How`] beside its own
//! fields) or a probe (the entry with a `probe` field). Written in time order; read back
//! into the same schedule. A field an entry does not know is refused, by its name.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::{How, Probe, Schedule, Step};

impl Serialize for Schedule {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut entries: Vec<Entry> = (self.steps.iter().enumerate())
            .map(|(index, step)| {
                Entry::Step(WrittenStep {
                    step,
                    how: self.how(index),
                })
            })
            .collect();
        entries.extend(self.probes.iter().map(Entry::Probe));
        // Stable: at the same time, the steps as written, then the probes.
        entries.sort_by_key(|entry| match entry {
            Entry::Step(written) => written.step.at_ms,
            Entry::Probe(probe) => probe.at_ms,
        });
        entries.serialize(serializer)
    }
}

/// One entry as written: a step's fields, then how it is done; or a probe.
#[derive(Serialize)]
#[serde(untagged)]
enum Entry<'a> {
    Step(WrittenStep<'a>),
    Probe(&'a Probe),
}

#[derive(Serialize)]
struct WrittenStep<'a> {
    #[serde(flatten)]
    step: &'a Step,
    #[serde(flatten)]
    how: &'a How,
}

/// The fields of [`How`], which a fault step's entry may carry beside its own.
const HOW_FIELDS: [&str; 5] = ["proxy", "direction", "by_ms", "rate_percent", "cut_link"];

impl<'de> Deserialize<'de> for Schedule {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Schedule, D::Error> {
        let entries = Vec::<Value>::deserialize(deserializer)?;
        let mut steps = Vec::new();
        let mut probes = Vec::new();
        for entry in entries {
            let Value::Object(mut fields) = entry else {
                return Err(D::Error::custom("a schedule's entry is a JSON object"));
            };
            if fields.contains_key("probe") {
                probes.push(Probe::deserialize(Value::Object(fields)).map_err(D::Error::custom)?);
                continue;
            }
            let mut how = Map::new();
            for name in HOW_FIELDS {
                if let Some(value) = fields.remove(name) {
                    how.insert(name.into(), value);
                }
            }
            let step = Step::deserialize(Value::Object(fields)).map_err(D::Error::custom)?;
            let how = How::deserialize(Value::Object(how)).map_err(D::Error::custom)?;
            steps.push((step, how));
        }
        // As written: a step's place is its place in the file (the player names the steps
        // it did not play by it).
        let (steps, hows) = steps.into_iter().unzip();
        Ok(Schedule {
            steps,
            hows,
            probes,
        })
    }
}

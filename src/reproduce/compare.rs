//! What a replay reached against what the run recorded, field by field.

use serde_json::{Map, Value};

use crate::labs::replay::{PartReplayed, Replayed};

/// Every part, compared.
#[derive(Debug)]
pub struct Compared {
    pub parts: Vec<PartCompared>,
}

#[derive(Debug)]
pub struct PartCompared {
    pub name: String,
    /// The fields the replay decided, in its order.
    pub fields: Vec<Field>,
    /// Fields only the recording has: not decided from the history (settings, times
    /// measured live, sentences), so not compared.
    pub as_recorded: Vec<String>,
}

#[derive(Debug)]
pub struct Field {
    pub name: String,
    pub replayed: Value,
    /// What the recording says of it; None when it does not say (an older lockslab).
    pub recorded: Option<Value>,
}

impl Field {
    pub fn agrees(&self) -> bool {
        self.recorded
            .as_ref()
            .is_none_or(|r| same(r, &self.replayed))
    }
}

impl PartCompared {
    pub fn compared(&self) -> impl Iterator<Item = &Field> {
        self.fields.iter().filter(|f| f.recorded.is_some())
    }

    pub fn disagreeing(&self) -> impl Iterator<Item = &Field> {
        self.fields.iter().filter(|f| !f.agrees())
    }
}

impl Compared {
    /// No compared field disagrees.
    pub fn agrees(&self) -> bool {
        self.parts.iter().all(|p| p.disagreeing().next().is_none())
    }

    pub fn count_compared(&self) -> usize {
        self.parts.iter().map(|p| p.compared().count()).sum()
    }

    pub fn count_disagreeing(&self) -> usize {
        self.parts.iter().map(|p| p.disagreeing().count()).sum()
    }
}

/// What every verdict line carries about itself, not about the run: the envelope, and the
/// verdict's words as the terminal showed them.
fn about_the_line(field: &str) -> bool {
    crate::events::envelope::FIELDS.contains(&field) || field == "text"
}

pub fn compare(replayed: &Replayed) -> Compared {
    Compared {
        parts: replayed.parts.iter().map(part).collect(),
    }
}

fn part(replayed: &PartReplayed) -> PartCompared {
    let empty = Map::new();
    let recorded = replayed.recorded.as_object().unwrap_or(&empty);
    PartCompared {
        name: replayed.name.clone(),
        fields: replayed
            .replayed
            .iter()
            .map(|(name, value)| Field {
                name: name.clone(),
                replayed: value.clone(),
                recorded: recorded.get(name).cloned(),
            })
            .collect(),
        as_recorded: recorded
            .keys()
            .filter(|name| !replayed.replayed.contains_key(*name))
            .filter(|name| !about_the_line(name))
            .cloned()
            .collect(),
    }
}

/// One fact, however it was written: numbers by value (a recorded `3` and a replayed `3.0`
/// are one, and a fraction read back from its JSON may land one step off the one computed:
/// the last of its 17 digits), and in objects a `null` the same as an absent field (older
/// lockslabs wrote `"token": null` where newer ones leave the field out).
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(x), Some(y)) => x == y,
            _ => {
                let (x, y) = (
                    x.as_f64().unwrap_or(f64::NAN),
                    y.as_f64().unwrap_or(f64::NAN),
                );
                x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
            }
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys = x.keys().chain(y.keys());
            keys.into_iter().all(|key| {
                let (x, y) = (
                    x.get(key).unwrap_or(&Value::Null),
                    y.get(key).unwrap_or(&Value::Null),
                );
                same(x, y)
            })
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn numbers_compare_by_value_and_null_is_absent() {
        assert!(same(&json!(3), &json!(3.0)));
        let read: Value = serde_json::from_str("12.63157894736842").unwrap();
        assert!(same(&read, &json!(240.0 / 19.0)));
        assert!(!same(&json!(12.6), &json!(12.7)));
        assert!(same(&json!({"a": 1, "b": null}), &json!({"a": 1})));
        assert!(!same(&json!({"a": 1}), &json!({"a": 2})));
        assert!(!same(&json!([1, 2]), &json!([1])));
        assert!(!same(&json!(true), &json!(null)));
    }

    #[test]
    fn a_field_the_recording_lacks_is_not_a_disagreement() {
        let mut replayed = Replayed::default();
        replayed.part(
            "run",
            &json!({"x": 1, "setting": 5}),
            json!({"x": 1, "new": 2}),
        );
        let compared = compare(&replayed);
        assert!(compared.agrees());
        assert_eq!(compared.count_compared(), 1);
        assert_eq!(compared.parts[0].as_recorded, ["setting"]);

        let mut replayed = Replayed::default();
        replayed.part("run", &json!({"x": 1}), json!({"x": 2}));
        let compared = compare(&replayed);
        assert!(!compared.agrees());
        assert_eq!(compared.count_disagreeing(), 1);
    }
}

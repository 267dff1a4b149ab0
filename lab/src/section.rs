//! Tagged sections of a run config written as flat keys: sweep files, `--set` and the `runs`
//! table write a task's (an encoding's) parameters beside `task = "block"` (`encoding = "tapa"`);
//! a run's config holds them in a section `{kind = "block", block_len = 8, …}`
//! ([`crate::task::TaskConfig`], [`crate::model::EncodingConfig`]). [`nest`] moves them, and
//! refuses by name a parameter that belongs to another kind.

use crate::hint::did_you_mean;

/// What is nested: the config key and its kinds with their parameter names.
pub struct Section<'a> {
    /// The key and the word in messages (`task`, `encoding`).
    pub key: &'static str,
    /// `a task name`, `an encoding name`.
    pub expected: &'static str,
    /// Every kind's name and its parameter names, in registry order.
    pub kinds: &'a [(&'static str, &'static [&'static str])],
    /// Whether a table without the key is an error (else it is returned unchanged, and serde
    /// names the missing field).
    pub required: bool,
}

/// Move `table`'s flat parameters of `section` into its section: `task = "block"` with
/// `block_len = 8` beside it becomes `task = { kind = "block", block_len = 8 }`. A key that is
/// already a section (a serialised run config) takes the flat keys over its own, so `--set
/// block_len=16` overrides a stored run's value.
///
/// # Errors
/// One line: a missing (when required) or unknown kind, with the closest name, or a parameter
/// of another kind (`max_letters: a parameter of task indirect, not of this run's task block;
/// …`).
pub fn nest(mut table: toml::Table, section: &Section) -> Result<toml::Table, String> {
    let key = section.key;
    let names: Vec<&str> = section.kinds.iter().map(|(n, _)| *n).collect();
    let list = names.join(", ");
    let mut nested = match table.remove(key) {
        Some(toml::Value::String(name)) => {
            let mut t = toml::Table::new();
            t.insert("kind".into(), toml::Value::String(name));
            t
        }
        Some(toml::Value::Table(t)) => t,
        Some(other) => {
            return Err(format!(
                "{key}: invalid type: {}, expected {} ({list})",
                other.type_str(),
                section.expected
            ));
        }
        None if section.required => return Err(format!("missing field `{key}` (one of {list})")),
        None => return Ok(table),
    };
    let name = match nested.get("kind") {
        Some(toml::Value::String(s)) => s.clone(),
        _ => return Err(format!("{key}: expected {} ({list})", section.expected)),
    };
    let Some(&(kind, params)) = section.kinds.iter().find(|(n, _)| *n == name) else {
        return Err(format!(
            "{key}: unknown {key} `{name}`, expected one of {list}{}",
            did_you_mean(&name, names.iter().copied())
        ));
    };
    let keys: Vec<String> = table.keys().cloned().collect();
    for k in keys {
        if params.contains(&k.as_str()) {
            let v = table.remove(&k).expect("listed key");
            nested.insert(k, v);
        } else if let Some((owner, _)) = section.kinds.iter().find(|(_, p)| p.contains(&k.as_str()))
        {
            return Err(format!(
                "{k}: a parameter of {key} {owner}, not of this run's {key} {kind}; remove it, \
                 or set it only for runs with {key} = \"{owner}\" (in their [[arms]])"
            ));
        }
    }
    table.insert(key.into(), toml::Value::Table(nested));
    Ok(table)
}

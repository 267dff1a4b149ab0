//! "Did you mean …?" for misspelt names (config fields, task parameters, sweep keys): the
//! closest candidate by edit distance; and which of the keys a user typed an error is about
//! ([`blamed`]). A leaf module: it imports nothing from the lab.

/// Levenshtein distance (for "did you mean").
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != *cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// `; did you mean `x`?` for the closest of `candidates` (within distance 3), else empty.
pub fn did_you_mean<'a>(key: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    candidates
        .into_iter()
        .map(|c| (edit_distance(key, c), c))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, c)| format!("; did you mean `{c}`?"))
        .unwrap_or_default()
}

/// The key among `given` (`KEY=VALUE` strings as typed, e.g. `--set` or `--param` values) that
/// an error `message` is about: the field the message starts with (`block_len = 300 is …`,
/// `encoding: unknown …`), else a field named in its parenthesised note (`… must be in
/// 1..=32 (seq_len)`: the bound comes from `seq_len`); `None` when the message is about none
/// of them (then the error lies in a file or a default, not in what was typed).
pub fn blamed<'a>(message: &str, given: &'a [String]) -> Option<&'a String> {
    // `presets.P.base.steps=5` is about `steps`.
    let key_of = |g: &String| {
        g.split_once('=')
            .map(|(k, _)| k.trim().rsplit('.').next().unwrap_or("").to_string())
    };
    let lead: String = message
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if let Some(g) = given
        .iter()
        .rev()
        .find(|g| key_of(g).as_deref() == Some(&lead))
    {
        return Some(g);
    }
    let note = message.rsplit_once('(').map(|(_, n)| n).unwrap_or("");
    let words: Vec<&str> = note
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    given
        .iter()
        .rev()
        .find(|g| key_of(g).is_some_and(|k| words.contains(&k.as_str())))
}

/// serde's "unknown field `x`, expected one of `a`, `b`" and "unknown variant `x`, expected
/// ..." messages, with the closest expected name appended (`; did you mean `a`?`); other
/// messages unchanged. Newlines become spaces (one line).
pub fn hint_unknown(message: &str) -> String {
    let message = message.replace('\n', " ");
    let message = message.trim_end();
    let Some(rest) = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))
    else {
        return message.to_string();
    };
    let Some((key, tail)) = rest.split_once('`') else {
        return message.to_string();
    };
    let candidates: Vec<&str> = tail
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|c| !c.is_empty())
        .collect();
    format!("{message}{}", did_you_mean(key, candidates))
}

/// One line for a deserialisation error at field path `path` (serde_path_to_error's, `.` at
/// the top): `steps: invalid type: …`, with [`hint_unknown`]'s suggestion for unknown names.
pub fn at_field(path: &str, message: &str) -> String {
    let message = hint_unknown(message);
    match path {
        "." | "" => message,
        path => format!("{path}: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_typed_key_an_error_is_about() {
        let given = vec!["seq_len=32".to_string(), "block_len=300".to_string()];
        let m = "block_len = 300 is out of range: must be in 1..=32 (seq_len)";
        assert_eq!(blamed(m, &given), Some(&given[1]));
        // Only the bound was typed: the bound is blamed.
        assert_eq!(blamed(m, &given[..1]), Some(&given[0]));
        assert_eq!(
            blamed("encoding: unknown encoding `foo`", &["encoding=foo".into()])
                .map(String::as_str),
            Some("encoding=foo")
        );
        assert_eq!(
            blamed("lr = -1 is out of range: must be in (0, 10]", &given),
            None
        );
        // A key that is a prefix of the field is not it.
        assert_eq!(blamed("steps_done = 3", &["steps=3".into()]), None);
        // A dotted path is about its last key.
        assert_eq!(
            blamed(
                "steps = 0 is out of range",
                &["presets.q.base.steps=0".into()]
            )
            .map(String::as_str),
            Some("presets.q.base.steps=0")
        );
    }

    #[test]
    fn distance() {
        assert_eq!(edit_distance("blok_len", "block_len"), 1);
        assert_eq!(edit_distance("", "ab"), 2);
        assert_eq!(did_you_mean("zzzzzzzz", ["seed"]), "");
        assert_eq!(
            did_you_mean("blok_len", ["seed", "block_len"]),
            "; did you mean `block_len`?"
        );
        assert_eq!(at_field("steps", "invalid type"), "steps: invalid type");
        assert_eq!(at_field(".", "missing field `x`"), "missing field `x`");
    }
}

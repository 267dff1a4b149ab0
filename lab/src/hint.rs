//! "Did you mean …?" for misspelt names (config fields, task parameters, sweep keys): the
//! closest candidate by edit distance. A leaf module: it imports nothing from the lab.

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

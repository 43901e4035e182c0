//! Why a configuration is refused: [`ConfigError`], each naming the key (as a dotted path), the
//! reason and the fix, with a hint for an unknown key (the nearest known one).
use std::path::PathBuf;

/// Errors loading the configuration. Each names the key (as a dotted path, `nvml.mode`), the
/// reason and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// An error in the file's text, said with the file's name.
    #[error("config file {}: {error}", path.display())]
    InFile { path: PathBuf, error: Box<ConfigError> },
    /// Not TOML at all (the position and the text are in `source`).
    #[error("not valid TOML: {source}")]
    Syntax { source: toml::de::Error },
    /// A key no part of gpu-tracer reads: a typo, or a key put in the wrong table.
    #[error("invalid setting {key}: unknown key{}; {hint}", at_line(*line))]
    UnknownKey {
        /// The full dotted path, `nvml.mod`, `otlp.include[0].namespaces`.
        key: String,
        line: Option<usize>,
        /// The near miss (`did you mean `mode`?`) or the keys that table has.
        hint: String,
    },
    /// A known key with a value of the wrong type or an unknown name (`mode = "of"`).
    #[error("invalid setting {key}: {why}{}", at_line(*line))]
    Value { key: String, line: Option<usize>, why: String },
    #[error("invalid setting {key}: {why}")]
    Invalid { key: &'static str, why: String },
}

fn at_line(line: Option<usize>) -> String {
    line.map(|l| format!(" (line {l})")).unwrap_or_default()
}

impl ConfigError {
    /// A short reason, for a metric label or a test.
    pub fn reason(&self) -> &'static str {
        match self {
            ConfigError::Read { .. } => "read",
            ConfigError::InFile { error, .. } => error.reason(),
            ConfigError::Syntax { .. } => "syntax",
            ConfigError::UnknownKey { .. } => "unknown_key",
            ConfigError::Value { .. } => "value",
            ConfigError::Invalid { .. } => "invalid",
        }
    }

    /// The error of deserializing `text`: the path serde was at says which key.
    pub(super) fn from_toml(text: &str, e: serde_path_to_error::Error<toml::de::Error>) -> Self {
        let key = e.path().to_string();
        let e = e.into_inner();
        let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        if key == "." {
            return ConfigError::Syntax { source: e };
        }
        // serde's own words: "unknown field `mod`, expected `mode` or `library`" (or "expected one
        // of `a`, `b`, ..." / "there are no fields"): the quoted names are the key, then the known.
        if e.message().starts_with("unknown field `") {
            let quoted: Vec<&str> = e.message().split('`').skip(1).step_by(2).collect();
            let (unknown, known) = quoted.split_first().map_or(("", &[][..]), |(u, k)| (*u, k));
            // Former names still read (serde aliases) but are not offered.
            let known: Vec<&str> = known.iter().copied().filter(|k| !FORMER_KEYS.contains(k)).collect();
            return ConfigError::UnknownKey { hint: unknown_key_hint(&key, unknown, &known), key, line };
        }
        ConfigError::Value { key, line, why: e.message().trim_end().to_string() }
    }
}

/// Keys renamed since they were introduced, accepted as aliases of the new names.
const FORMER_KEYS: &[&str] = &["driver_entry_durations"];

/// "did you mean `mode`?" for a near miss, else the keys the table has.
fn unknown_key_hint(path: &str, unknown: &str, known: &[&str]) -> String {
    if let Some(best) = known
        .iter()
        .map(|k| (edit_distance(unknown, k), *k))
        .filter(|(d, _)| *d <= 1 + unknown.len() / 4)
        .min()
        .map(|(_, k)| k)
    {
        return format!("did you mean `{best}`?");
    }
    let table = match path.rsplit_once('.') {
        Some((parent, _)) => format!("the keys of `{parent}` are"),
        None => "the top-level keys are".to_string(),
    };
    if known.is_empty() {
        return "this table has no keys (docs/configuration.md)".to_string();
    }
    let list: Vec<String> = known.iter().map(|k| format!("`{k}`")).collect();
    format!("{table} {} (docs/configuration.md)", list.join(", "))
}

/// Levenshtein distance (keys are short ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

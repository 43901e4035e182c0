//! Bearer-token files (`api.token_file`, `metrics.token_file`, the clients' `--token-file`):
//! read once, surrounding whitespace ignored, and a file with nothing else in it refused — an
//! empty token would switch authentication off without anyone having asked for that.
use std::path::{Path, PathBuf};

/// A token file that cannot be used: the setting or flag, the file, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} ({}): {why}", path.display())]
pub struct TokenFileError {
    pub key: &'static str,
    pub path: PathBuf,
    pub why: String,
}

/// The token `path` holds, for the setting `key` (named in the error).
pub fn read_token_file(key: &'static str, path: &Path) -> Result<String, TokenFileError> {
    let err = |why: String| TokenFileError { key, path: path.to_path_buf(), why };
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot read: {e}")))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(err("the file is empty (or only whitespace): a token is required when the setting is given; \
             leave the setting out to run without one"
            .into()));
    }
    if token.chars().any(|c| c.is_control()) {
        return Err(err("the token has a control character in it (a bearer token is one line of text)".into()));
    }
    Ok(token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_blank_missing_and_multi_line_token_files_are_refused_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        for (name, text) in [("empty", ""), ("newline", "\n"), ("blank", " \t\r\n  \n")] {
            let p = write(name, text);
            let e = read_token_file("api.token_file", &p).unwrap_err();
            assert_eq!(e.key, "api.token_file");
            assert!(e.why.contains("empty"), "{name}: {e}");
            assert!(e.to_string().starts_with("api.token_file ("), "{e}");
        }
        let e = read_token_file("metrics.token_file", &write("two", "a\nb\n")).unwrap_err();
        assert!(e.why.contains("control character"), "{e}");
        let e = read_token_file("metrics.token_file", &dir.path().join("missing")).unwrap_err();
        assert!(e.why.starts_with("cannot read"), "{e}");
        assert_eq!(read_token_file("api.token_file", &write("ok", "  s3cret \n")).unwrap(), "s3cret");
    }
}
